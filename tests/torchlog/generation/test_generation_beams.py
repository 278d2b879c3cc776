"""Beam search under `log_generation`: each step runs on prompts x beams rows, its activations
are those a forward hook reads in plain `generate`, and the sequences (and the beams they came
from) are plain `generate`'s; joining the steps, whose rows generate reorders, is refused."""
from __future__ import annotations

import pytest
import torch

import torchlog
from tests.invariants import check_history
from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError
from torchlog.interventions import add

from .decoding import hooked_generate, recorded_generate, tiny_gpt2, tiny_llama, tiny_mamba, tiny_t5

pytestmark = pytest.mark.heavy
BEAMS, STEPS = 3, 4
MODELS = {"gpt2": (tiny_gpt2, "transformer.h.1"), "llama": (tiny_llama, "model.layers.1"),
          "mamba": (tiny_mamba, "backbone.layers.1"), "t5": (tiny_t5, "decoder.block.1")}
KEYWORDS = dict(max_new_tokens=STEPS, do_sample=False, num_beams=BEAMS, num_return_sequences=2,
                return_dict_in_generate=True, output_scores=True)


def _prompts() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randint(3, 100, (2, 6))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_beam_search_steps_equal_plain_generate_read_by_hooks(name: str) -> None:
    build, site = MODELS[name]
    model, _ = build()
    ids = _prompts()
    plain, seen = recorded_generate(model, ids, site, **KEYWORDS)
    # From step 2 on a step is served from the probe kept at step 1 only where the cache's
    # lengths match (T5's position bias grows with the cache): each step's shapes are its own.
    gen = torchlog.log_generation(model, ids, layers_to_save=[site], **KEYWORDS)
    for step in gen.steps:
        check_history(step)
    assert torch.equal(gen.sequences, plain.sequences)
    assert torch.equal(gen.output.beam_indices, plain.beam_indices)
    assert gen.num_beams == BEAMS and gen.num_steps == len(seen) == STEPS
    assert list(gen.beam_rows(1)) == [3, 4, 5]
    for k in range(STEPS):
        assert gen.input_ids(k).shape[0] == gen.logits(k).shape[0] == 2 * BEAMS  # prompts x beams rows
        torch.testing.assert_close(gen[k, site].tensor_contents, seen[k], rtol=1e-5, atol=1e-5)
    start = 1 if name == "t5" else ids.shape[1]  # after the decoder's start token, or the prompt
    assert torch.equal(gen.tokens, plain.sequences[:, start:])
    assert torch.equal(gen.token(2), plain.sequences[:, start + 2])
    with pytest.raises(InvalidOptionError, match=r"cannot join the steps of a beam search \(num_beams=3\)"):
        gen.stack(site)


def test_steered_beam_search_equals_a_hooked_generate() -> None:
    model, _ = tiny_gpt2()
    ids = _prompts()
    vector = torch.randn(32) * 4.0
    keywords = dict(max_new_tokens=STEPS, do_sample=False, num_beams=BEAMS)
    oracle = hooked_generate(model, ids, "transformer.h.0", lambda call, h: h + vector if call >= 1 else h,
                             **keywords)
    assert not torch.equal(oracle, model.generate(ids, **keywords))
    gen = torchlog.log_generation(model, ids, intervene={"transformer.h.0": add(vector)},
                                  intervene_steps=range(1, STEPS), layers_to_save=None, **keywords)
    assert torch.equal(gen.sequences, oracle)
    assert [i.step for i in gen.interventions] == [1, 2, 3]


def test_the_beams_come_from_the_generation_config_and_bad_values_are_named() -> None:
    model, _ = tiny_gpt2()
    ids = _prompts()
    config = model.generation_config.__class__(num_beams=2, max_new_tokens=2, do_sample=False,
                                                pad_token_id=0, eos_token_id=0)
    gen = torchlog.log_generation(model, ids, generation_config=config, layers_to_save=None)
    assert gen.num_beams == 2 and gen.input_ids(1).shape[0] == 4
    assert "2 beams per prompt" in str(gen)
    with pytest.raises(InvalidArgumentTypeError, match=r"beam_rows takes a prompt's index, 0..1 .* got 2"):
        gen.beam_rows(2)
    with pytest.raises(InvalidArgumentTypeError, match=r"num_beams must be an int >= 1, got 0"):
        torchlog.log_generation(model, ids, num_beams=0, max_new_tokens=2)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_follow_traces_a_hypothesis_equal_to_one_forward_over_its_sequence(name: str) -> None:
    """The rows a returned sequence went through, joined: with a KV cache, the block's output
    of one plain forward over that sequence (the tokens the steps read), by a forward hook."""
    build, site = MODELS[name]
    model, _ = build()
    ids = _prompts()
    gen = torchlog.log_generation(model, ids, layers_to_save=[site], **KEYWORDS)
    paths = [gen.beam_path(sequence) for sequence in range(gen.sequences.shape[0])]
    assert any(len(set(path)) > 1 for path in paths)  # a hypothesis moved rows: row j alone would not do
    for sequence, path in enumerate(paths):
        assert 1 <= len(path) <= STEPS and all(0 <= row < 2 * BEAMS for row in path)
        assert path[0] in gen.beam_rows(sequence // 2)  # its prompt's beams
        read = gen.sequences[sequence:sequence + 1, :ids.shape[1] + len(path) - 1]
        seen = []
        handle = model.get_submodule(site).register_forward_hook(
            lambda m, a, out: seen.append((out[0] if isinstance(out, tuple) else out).detach()))
        try:
            with torch.no_grad():
                model(read)
        finally:
            handle.remove()
        torch.testing.assert_close(gen.follow(site, sequence), seen[0], rtol=1e-4, atol=1e-5)


def test_follow_refuses_what_it_cannot_trace() -> None:
    model, _ = tiny_gpt2()
    ids = _prompts()
    plain = torchlog.log_generation(model, ids, layers_to_save=None, max_new_tokens=2, do_sample=False, num_beams=2)
    with pytest.raises(InvalidOptionError, match="return_dict_in_generate=True, output_scores=True"):
        plain.follow("transformer.h.1", 0)
    greedy = torchlog.log_generation(model, ids, layers_to_save=None, max_new_tokens=2, do_sample=False)
    with pytest.raises(InvalidOptionError, match="use gen.stack"):
        greedy.follow("transformer.h.1", 0)
    traced = torchlog.log_generation(model, ids, layers_to_save=None, **KEYWORDS)
    with pytest.raises(InvalidArgumentTypeError, match=r"0\.\.3 for this generation's 4 sequence"):
        traced.beam_path(4)
