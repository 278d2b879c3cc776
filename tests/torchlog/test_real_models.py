"""The invariants and the forward-hook oracle on real architectures: torch.nn's recurrent and
attention modules, and transformers models built from tiny configs (no weight downloads)."""
from __future__ import annotations

import copy

import pytest
import torch
import transformers
from torch import nn
from torch.overrides import TorchFunctionMode

import torchlog
from tests.invariants import (
    check_against_plain_run,
    check_history,
    check_module_outputs,
    record_module_outputs,
)

SEQ = 8


class Wrapped(nn.Module):
    """Puts a module one level down so the oracle sees its calls as a submodule's calls."""

    def __init__(self, inner: nn.Module, calls: int = 1) -> None:
        super().__init__()
        self.inner = inner
        self.calls = calls

    def forward(self, *args, **kwargs):
        out = None
        for _ in range(self.calls):
            out = self.inner(*args, **kwargs)
        return out


def _torch_cases() -> dict:
    return {
        "lstm": (lambda: Wrapped(nn.LSTM(6, 5, num_layers=2, batch_first=True, bidirectional=True)),
                 lambda: (torch.randn(2, SEQ, 6),)),
        "gru_with_h0": (lambda: Wrapped(nn.GRU(6, 5, num_layers=2, dropout=0.3), calls=2),
                        lambda: (torch.randn(SEQ, 2, 6), torch.randn(2, 2, 5))),
        "transformer_encoder": (
            lambda: Wrapped(nn.TransformerEncoder(
                nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.1, batch_first=True),
                num_layers=2, enable_nested_tensor=False)),
            lambda: (torch.randn(2, SEQ, 16),)),
        "multihead_attention": (lambda: Wrapped(nn.MultiheadAttention(16, 2, dropout=0.1, batch_first=True)),
                                lambda: (torch.randn(2, SEQ, 16),) * 3),
    }


TORCH_CASES = _torch_cases()


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", sorted(TORCH_CASES))
def test_torch_nn_models(name: str, training: bool) -> None:
    make_model, make_args = TORCH_CASES[name]
    torch.manual_seed(0)
    model, args = make_model().train(training), make_args()
    history, _, _ = check_against_plain_run(model, args, seed=3)
    assert history.modules["inner"].num_passes == model.calls


class _InertMode(TorchFunctionMode):
    """A TorchFunctionMode that only calls the function, like torchlog's mode minus the logging."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_transformer_encoder_under_no_grad_matches_an_inert_mode_exactly() -> None:
    """In eval mode without grad, TransformerEncoderLayer has a fused fast path that it skips
    whenever a TorchFunctionMode is active (`has_torch_function`), so under any such mode it
    runs the slow path, whose floats differ in the last bits. torchlog must match the slow path
    exactly, and the fast path closely."""
    make_model, make_args = TORCH_CASES["transformer_encoder"]
    torch.manual_seed(0)
    model, args = make_model().eval(), make_args()
    logged = copy.deepcopy(model)
    with torch.no_grad():
        fast_seen, fast_out = record_module_outputs(copy.deepcopy(model), args, seed=3)
        with _InertMode():
            slow_seen, slow_out = record_module_outputs(copy.deepcopy(model), args, seed=3)
        history = torchlog.log_forward_pass(logged, list(args), random_seed=3)
    check_history(history)
    check_module_outputs(history, logged, slow_seen)
    (out,) = history.output_layers
    assert torch.equal(history[out].tensor_contents, slow_out)
    torch.testing.assert_close(history[out].tensor_contents, fast_out)
    assert history.modules["inner.layers.0"].num_passes == len(fast_seen["inner.layers.0"]) == 1


def test_multihead_attention_key_padding_mask_and_weights() -> None:
    torch.manual_seed(0)
    model = Wrapped(nn.MultiheadAttention(16, 2, batch_first=True)).eval()
    q = torch.randn(2, SEQ, 16)
    mask = torch.zeros(2, SEQ, dtype=torch.bool)
    mask[1, -3:] = True
    history, _, output = check_against_plain_run(model, (q, q, q), {"key_padding_mask": mask}, seed=0)
    assert len(history.modules["inner"].call_outputs[0]) == 2, "MHA returns (output, weights)"
    assert isinstance(output, tuple) and len(history.output_layers) == 2


# ----- transformers, built from tiny configs ---------------------------------------------------


def _ids(vocab: int = 100) -> torch.Tensor:
    return torch.randint(0, vocab, (1, SEQ))


def _gpt2():
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config), {"input_ids": _ids()}


def _bert():
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                     intermediate_size=64, vocab_size=100, max_position_embeddings=16)
    mask = torch.ones(1, SEQ, dtype=torch.long)
    mask[0, -2:] = 0
    return transformers.BertModel(config), {"input_ids": _ids(), "attention_mask": mask}


def _t5():
    config = transformers.T5Config(num_layers=2, num_decoder_layers=2, d_model=32, d_kv=16, d_ff=64,
                                   num_heads=2, vocab_size=100, decoder_start_token_id=0)
    return transformers.T5ForConditionalGeneration(config), {"input_ids": _ids(), "decoder_input_ids": _ids()}


def _llama():
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=64, vocab_size=100,
                                      max_position_embeddings=16)
    return transformers.LlamaForCausalLM(config), {"input_ids": _ids()}


def _mixtral():
    config = transformers.MixtralConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                        num_key_value_heads=1, intermediate_size=64, vocab_size=100,
                                        max_position_embeddings=16, num_local_experts=4,
                                        num_experts_per_tok=2)
    return transformers.MixtralForCausalLM(config), {"input_ids": _ids()}


TRANSFORMERS = {"gpt2": _gpt2, "bert": _bert, "t5": _t5, "llama": _llama, "mixtral": _mixtral}


@pytest.mark.heavy
@pytest.mark.parametrize("attention", ["default", "eager"])
@pytest.mark.parametrize("name", sorted(TRANSFORMERS))
def test_transformers_models(name: str, attention: str) -> None:
    torch.manual_seed(0)
    model, kwargs = TRANSFORMERS[name]()
    if attention == "eager":
        model.config._attn_implementation = "eager"
    model.eval()
    history, _, _ = check_against_plain_run(model, (), kwargs, seed=0)
    assert history.modules, "a transformers model has submodules"
    assert any(p.params for p in history), "the model's weights were used"


@pytest.mark.heavy
def test_transformers_training_mode_dropout() -> None:
    """With dropout active, the logged run still equals a plain run with the same seed."""
    torch.manual_seed(0)
    model, kwargs = _bert()
    assert model.config.hidden_dropout_prob > 0
    check_against_plain_run(model.train(), (), kwargs, seed=7)


# ----- more architectures, each checked against the hook oracle in eval and train mode ---------
_SMALL = dict(hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=100,
              max_position_embeddings=32)
_TOKENS = dict(pad_token_id=0, bos_token_id=0, eos_token_id=0)


def _encoder_decoder(config: type, model: type, **sizes):
    config = config(d_model=32, encoder_attention_heads=2, decoder_attention_heads=2,
                    encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=100,
                    decoder_start_token_id=0, **_TOKENS, **sizes)
    return model(config)


def _image(size: int = 16) -> torch.Tensor:
    return torch.randn(1, 3, size, size)


T = transformers
ARCHITECTURES = {
    "roberta": lambda: (T.RobertaModel(T.RobertaConfig(num_hidden_layers=2, **_SMALL)), {"input_ids": _ids()}),
    "distilbert": lambda: (T.DistilBertModel(T.DistilBertConfig(
        n_layers=2, dim=32, n_heads=2, hidden_dim=64, vocab_size=100, max_position_embeddings=32)),
        {"input_ids": _ids()}),
    "deberta_v2": lambda: (T.DebertaV2Model(T.DebertaV2Config(num_hidden_layers=2, **_SMALL)),
                           {"input_ids": _ids()}),
    "bart": lambda: (_encoder_decoder(T.BartConfig, T.BartModel, encoder_layers=1, decoder_layers=1,
                                      max_position_embeddings=32),
                     {"input_ids": _ids(), "decoder_input_ids": _ids()}),
    "whisper": lambda: (_encoder_decoder(T.WhisperConfig, T.WhisperModel, encoder_layers=1,
                                         decoder_layers=1, num_mel_bins=8, max_source_positions=16,
                                         max_target_positions=16),
                        {"input_features": torch.randn(1, 8, 32), "decoder_input_ids": _ids()}),
    "opt": lambda: (T.OPTModel(T.OPTConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                           ffn_dim=64, vocab_size=100, max_position_embeddings=32,
                                           word_embed_proj_dim=32, **_TOKENS)), {"input_ids": _ids()}),
    "mistral": lambda: (T.MistralModel(T.MistralConfig(num_hidden_layers=2, num_key_value_heads=1, **_SMALL)),
                        {"input_ids": _ids()}),
    "qwen2": lambda: (T.Qwen2Model(T.Qwen2Config(num_hidden_layers=2, num_key_value_heads=1, **_SMALL)),
                      {"input_ids": _ids()}),
    "gpt_neox": lambda: (T.GPTNeoXModel(T.GPTNeoXConfig(num_hidden_layers=2, **_SMALL, **_TOKENS)),
                         {"input_ids": _ids()}),
    "falcon": lambda: (T.FalconModel(T.FalconConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                                    vocab_size=100, **_TOKENS)), {"input_ids": _ids()}),
    "phi": lambda: (T.PhiModel(T.PhiConfig(num_hidden_layers=2, **_SMALL)), {"input_ids": _ids()}),
    "mamba": lambda: (T.MambaModel(T.MambaConfig(num_hidden_layers=2, hidden_size=32, vocab_size=100,
                                                 state_size=4, **_TOKENS)), {"input_ids": _ids()}),
    "clip_text": lambda: (T.CLIPTextModel(T.CLIPTextConfig(num_hidden_layers=2, **_SMALL, **_TOKENS)),
                          {"input_ids": _ids()}),
    "vit": lambda: (T.ViTModel(T.ViTConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                           intermediate_size=64, image_size=16, patch_size=8)),
                    {"pixel_values": _image()}),
    "swin": lambda: (T.SwinModel(T.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                                              num_heads=[2, 2], window_size=4)),
                     {"pixel_values": _image(32)}),
    "convnext": lambda: (T.ConvNextModel(T.ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2)),
                         {"pixel_values": _image(32)}),
    "wav2vec2": lambda: (T.Wav2Vec2Model(T.Wav2Vec2Config(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64, conv_dim=(8, 8),
        conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2)), {"input_values": torch.randn(1, 400)}),
}


@pytest.mark.heavy
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_more_transformers_architectures(name: str, training: bool) -> None:
    """Every module call's outputs equal what forward hooks see on a plain run of a copy."""
    torch.manual_seed(0)
    model, kwargs = ARCHITECTURES[name]()
    history, _, _ = check_against_plain_run(model.train(training), (), kwargs, seed=1)
    assert len(history.modules) > 5 and any(p.params for p in history)
