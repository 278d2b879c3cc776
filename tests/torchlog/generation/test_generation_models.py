"""Models people generate with, step by step, against a hand-written decode loop read by forward
hooks (activations at a site, logits, input and chosen tokens) and plain `generate` (tokens):
LLaMA-style (rotary, grouped-query attention), Mamba (a state, no KV cache), T5
(encoder-decoder) and batches of padded prompts."""
from __future__ import annotations

import pytest
import torch

import torchlog
from torchlog.interventions import add

from .decoding import hand_decode, hooked_generate, tiny_gpt2, tiny_llama, tiny_mamba, tiny_t5

pytestmark = pytest.mark.heavy
TOL = dict(rtol=1e-5, atol=1e-5)
MODELS = {"gpt2": (tiny_gpt2, "transformer.h.1", "transformer.h.0"),
          "llama": (tiny_llama, "model.layers.1", "model.layers.0")}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_and_sites(request):
    build, site, edit_site = MODELS[request.param]
    model, prompt = build()
    return model, prompt, site, edit_site


def test_llama_steps_equal_the_hand_written_decode_loop() -> None:
    model, prompt = tiny_llama()
    site = "model.layers.1"
    gen = torchlog.log_generation(model, prompt, max_new_tokens=5, do_sample=False)
    oracle = hand_decode(model, prompt, 5, site=site)
    assert torch.equal(gen.sequences, oracle.sequence)
    assert torch.equal(gen.sequences, model.generate(prompt, max_new_tokens=5, do_sample=False))
    for k in range(5):
        torch.testing.assert_close(gen.logits(k), oracle.logits[k], **TOL)
        torch.testing.assert_close(gen[k, site].tensor_contents, oracle.activations[k], **TOL)
    assert all(gen.steps[k].layer_labels == gen.steps[1].layer_labels for k in range(1, 5))
    assert gen.stack(site).shape == (1, 6 + 4, 32)


def _assert_steps_equal(gen, oracle, site: str, num_steps: int) -> None:
    """Each step's activation at `site`, logits, input tokens and chosen token equal what the
    hand-written loop's hooks read."""
    assert gen.num_steps == len(oracle.activations) == num_steps
    assert torch.equal(gen.sequences, oracle.sequence)
    for k in range(num_steps):
        torch.testing.assert_close(gen[k, site].tensor_contents, oracle.activations[k], **TOL)
        torch.testing.assert_close(gen.logits(k), oracle.logits[k], **TOL)
        assert torch.equal(gen.input_ids(k), oracle.inputs[k])
        assert torch.equal(gen.token(k), oracle.tokens[k])


@pytest.mark.parametrize("name", ["gpt2", "llama", "mamba", "t5"])
def test_a_padded_batch_equals_the_hand_written_decode_loop(name: str) -> None:
    build, site = {"gpt2": (tiny_gpt2, "transformer.h.1"), "llama": (tiny_llama, "model.layers.1"),
                   "mamba": (tiny_mamba, "backbone.layers.1"), "t5": (tiny_t5, "decoder.block.1")}[name]
    model, _ = build()
    torch.manual_seed(1)
    ids = torch.randint(3, 100, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    if name == "t5":  # an encoder's input is padded on the right
        ids[1, -2:], mask[1, -2:] = 0, 0
    else:  # a decoder-only prompt on the left, so that every prompt ends where generation starts
        ids[1, :2], mask[1, :2] = 0, 0
    gen = torchlog.log_generation(model, ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    _assert_steps_equal(gen, hand_decode(model, ids, 4, site=site, attention_mask=mask), site, 4)
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    assert torch.equal(gen.sequences, plain)


def test_steering_each_model_equals_a_hooked_generate(model_and_sites) -> None:
    model, prompt, _, edit_site = model_and_sites
    torch.manual_seed(3)
    vector = torch.randn(32) * 4.0
    oracle = hooked_generate(model, prompt, edit_site, lambda call, h: h + vector if call >= 1 else h,
                             max_new_tokens=5, do_sample=False)
    assert not torch.equal(oracle, model.generate(prompt, max_new_tokens=5, do_sample=False))
    gen = torchlog.log_generation(model, prompt, intervene={edit_site: add(vector)},
                                  intervene_steps=range(1, 5), max_new_tokens=5, do_sample=False)
    assert torch.equal(gen.sequences, oracle)
    assert [i.step for i in gen.interventions] == [1, 2, 3, 4]


def test_mamba_steps_read_the_recurrent_state_and_equal_the_hand_written_decode_loop() -> None:
    model, prompt = tiny_mamba()
    site = "backbone.layers.1"
    gen = torchlog.log_generation(model, prompt, max_new_tokens=5, do_sample=False)
    _assert_steps_equal(gen, hand_decode(model, prompt, 5, site=site), site, 5)
    assert torch.equal(gen.sequences, model.generate(prompt, max_new_tokens=5, do_sample=False))
    assert all(gen.steps[k].layer_labels == gen.steps[1].layer_labels for k in range(1, 5))
    # No cache grows: each decoding step reads a convolution and an SSM state per layer, of fixed size.
    states = [[tuple(gen.steps[k][label].tensor_contents.shape) for label in gen.steps[k].input_layers[1:]]
              for k in (1, 4)]
    assert states[0] == states[1] and len(states[0]) == 2 * 2
    assert gen.stack(site).shape == (1, 6 + 4, 32)


def test_t5_logs_each_decoder_forward_as_a_step_after_the_start_token() -> None:
    model, prompt = tiny_t5()
    site = "decoder.block.1"
    plain = model.generate(prompt, max_new_tokens=5, do_sample=False)
    gen = torchlog.log_generation(model, prompt, max_new_tokens=5, do_sample=False)
    _assert_steps_equal(gen, hand_decode(model, prompt, 5, site=site), site, 5)
    assert torch.equal(gen.sequences, plain)
    assert torch.equal(gen.tokens, plain[:, 1:])  # after the decoder's start token, not the prompt
    assert torch.equal(gen.input_ids(0), plain[:, :1])
    torch.manual_seed(3)
    vector = torch.randn(32) * 50.0
    oracle = hooked_generate(model, prompt, "decoder.block.0", lambda call, h: h + vector,
                             max_new_tokens=5, do_sample=False)
    assert not torch.equal(oracle, plain)
    steered = torchlog.log_generation(model, prompt, intervene={"decoder.block.0": add(vector)},
                                      max_new_tokens=5, do_sample=False)
    assert torch.equal(steered.sequences, oracle)
