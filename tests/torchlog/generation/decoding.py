"""A tiny GPT-2 built from a transformers config, and the oracle: a hand-written greedy decode
loop with plain forward hooks, which records per-step activations, logits and tokens."""
from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch import nn

transformers = __import__("pytest").importorskip("transformers")

SITE = "transformer.h.1"  # the block whose output the tests compare per step
# The KV cache's keyword and output field: `cache` from transformers 5, `past_key_values` before.
CACHE = "cache" if "cache" in inspect.signature(transformers.GPT2LMHeadModel.forward).parameters \
    else "past_key_values"


def tiny_gpt2(seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    """GPT-2 of 2 blocks, eager attention, random weights (no download), and a prompt (1, 6)."""
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
                                     bos_token_id=0, eos_token_id=0, pad_token_id=0,
                                     attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(config).eval()
    prompt = torch.randint(1, 100, (1, 6))
    return model, prompt


def steering_gpt2() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """`tiny_gpt2` with a steering vector of its width, large enough to move greedy tokens."""
    model, prompt = tiny_gpt2()
    torch.manual_seed(1)
    return model, prompt, torch.randn(32) * 4.0


def block_output(output: object) -> torch.Tensor:
    """A block's hidden states, whether it returns a tensor or a tuple."""
    return output[0] if isinstance(output, tuple) else output


class Recorded:
    """What a hand-written decode loop saw at each step, read by forward hooks."""

    def __init__(self) -> None:
        self.activations: list[torch.Tensor] = []  # SITE's output per forward call
        self.logits: list[torch.Tensor] = []  # last-position logits per step
        self.tokens: list[torch.Tensor] = []  # the token chosen per step
        self.inputs: list[torch.Tensor] = []  # the token ids each step read


def tiny_llama(seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    """A LLaMA-style model (rotary positions, grouped-query attention: 4 heads, 2 key-value
    heads) of 2 layers, eager attention, random weights, and a prompt (1, 6)."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                                      max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
                                      pad_token_id=0, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config).eval()
    prompt = torch.randint(3, 100, (1, 6))
    return model, prompt


def tiny_mamba(seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    """A Mamba of 2 layers (a recurrent state instead of a KV cache, the reference PyTorch
    scan), random weights, and a prompt (1, 6)."""
    torch.manual_seed(seed)
    config = transformers.MambaConfig(hidden_size=32, state_size=8, num_hidden_layers=2, vocab_size=100,
                                      bos_token_id=1, eos_token_id=2, pad_token_id=0, expand=2, conv_kernel=4)
    return transformers.MambaForCausalLM(config).eval(), torch.randint(3, 100, (1, 6))


def tiny_t5(seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    """A T5 encoder-decoder of 2 layers each, random weights, and an encoder input (1, 6)."""
    torch.manual_seed(seed)
    config = transformers.T5Config(d_model=32, d_ff=64, d_kv=8, num_layers=2, num_heads=4, vocab_size=100,
                                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return transformers.T5ForConditionalGeneration(config).eval(), torch.randint(3, 100, (1, 6))


def hand_decode(model: nn.Module, prompt: torch.Tensor, num_steps: int,
                edit: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
                edit_site: str = "transformer.h.0", site: str = SITE,
                attention_mask: torch.Tensor | None = None) -> Recorded:
    """Greedy decoding by hand with a KV cache (or Mamba's state): one forward per step,
    hooks reading `site` and, with `edit(step, hidden)`, changing `edit_site`'s output at
    each step. An encoder-decoder runs its encoder once first, then the decoder from its
    start token; `attention_mask` marks a batch's left padding, as generate reads it."""
    seen = Recorded()
    step = [0]

    def read(module: nn.Module, args: tuple, output: object) -> None:
        seen.activations.append(block_output(output).detach().clone())

    def change(module: nn.Module, args: tuple, output: object) -> object:
        hidden = edit(step[0], block_output(output))
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    handles = [model.get_submodule(site).register_forward_hook(read)]
    if edit is not None:
        handles.append(model.get_submodule(edit_site).register_forward_hook(change))
    inputs = _StepInputs(model, prompt, attention_mask)
    try:
        cache, ids = None, inputs.first
        with torch.no_grad():
            for step[0] in range(num_steps):
                seen.inputs.append(ids)
                out = model(**inputs.of_step(ids), use_cache=True, **{CACHE: cache})
                cache = getattr(out, CACHE)
                seen.logits.append(out.logits[:, -1].clone())
                ids = out.logits[:, -1].argmax(-1, keepdim=True)
                seen.tokens.append(ids[:, 0])
                inputs.chose(ids)
    finally:
        for handle in handles:
            handle.remove()
    seen.sequence = inputs.sequence
    return seen


class _StepInputs:
    """What a hand-written loop passes at each step: the token ids (as `decoder_input_ids`
    after the encoder's output for an encoder-decoder), the attention mask over the prompt
    and the tokens so far, and the positions generate derives from it (padding counts none)."""

    def __init__(self, model: nn.Module, prompt: torch.Tensor, mask: torch.Tensor | None) -> None:
        self.is_encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
        self.takes_positions = "position_ids" in inspect.signature(model.forward).parameters
        # Generate gives Mamba the mask at the prefill only: the state has no later positions to mask.
        self.masks_prompt_only = model.config.model_type == "mamba"
        self.mask = mask
        if self.is_encoder_decoder:
            with torch.no_grad():
                self.encoded = model.get_encoder()(input_ids=prompt, attention_mask=mask)
            self.prompt_mask = mask
            self.first = torch.full((prompt.shape[0], 1), model.config.decoder_start_token_id)
        else:
            self.first = prompt
        self.sequence = self.first

    def of_step(self, ids: torch.Tensor) -> dict[str, object]:
        if self.is_encoder_decoder:
            return {"decoder_input_ids": ids, "encoder_outputs": self.encoded, "attention_mask": self.prompt_mask}
        found: dict[str, object] = {"input_ids": ids}
        if self.mask is not None:
            found["attention_mask"] = self.mask
            if self.takes_positions:
                positions = (self.mask.cumsum(-1) - 1).masked_fill(self.mask == 0, 0)
                found["position_ids"] = positions[:, -ids.shape[-1]:]
        return found

    def chose(self, ids: torch.Tensor) -> None:
        self.sequence = torch.cat([self.sequence, ids], dim=-1)
        if self.masks_prompt_only:
            self.mask = None
        elif self.mask is not None and not self.is_encoder_decoder:
            self.mask = torch.cat([self.mask, torch.ones_like(ids)], dim=-1)


def recorded_generate(model: nn.Module, prompt: torch.Tensor, site: str,
                      **kwargs: object) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Plain `model.generate` and `site`'s output at each forward call, read by a hook."""
    seen: list[torch.Tensor] = []
    handle = model.get_submodule(site).register_forward_hook(
        lambda module, args, output: seen.append(block_output(output).detach().clone()))
    try:
        return model.generate(prompt, **kwargs), seen
    finally:
        handle.remove()


def hooked_generate(model: nn.Module, prompt: torch.Tensor, site: str,
                    edit: Callable[[int, torch.Tensor], torch.Tensor], **kwargs: object) -> torch.Tensor:
    """`model.generate` with `edit(call, hidden)` applied by a plain forward hook on `site`."""
    calls = [0]

    def change(module: nn.Module, args: tuple, output: object) -> object:
        hidden = edit(calls[0], block_output(output))
        calls[0] += 1
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    handle = model.get_submodule(site).register_forward_hook(change)
    try:
        return model.generate(prompt, **kwargs)
    finally:
        handle.remove()
