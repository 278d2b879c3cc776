"""Interventions per step: steered tokens equal `generate` with the same edit made by a plain
forward hook, at every step, at chosen steps, on the prompt only, and patched per step."""
from __future__ import annotations

import pytest
import torch

import torchlog
from torchlog.interventions import add, patch_from

from .decoding import block_output, hand_decode, hooked_generate, steering_gpt2, tiny_gpt2

pytestmark = pytest.mark.heavy
BLOCK = "transformer.h.0"
STEPS = 6


@pytest.fixture(scope="module")
def gpt2():
    return steering_gpt2()


def _steered(model, prompt, vector, steps):
    """Tokens of plain generate with `vector` added to BLOCK's output by a hook at `steps`."""
    return hooked_generate(model, prompt, BLOCK, lambda call, h: h + vector if call in steps else h,
                           max_new_tokens=STEPS, do_sample=False)


def test_a_steering_vector_at_every_step_gives_the_hooked_generate_tokens(gpt2) -> None:
    model, prompt, vector = gpt2
    oracle = _steered(model, prompt, vector, range(STEPS))
    assert not torch.equal(oracle, model.generate(prompt, max_new_tokens=STEPS, do_sample=False))
    gen = torchlog.log_generation(model, prompt, intervene={BLOCK: add(vector)},
                                  max_new_tokens=STEPS, do_sample=False)
    assert torch.equal(gen.sequences, oracle)
    assert [i.step for i in gen.interventions] == list(range(STEPS))
    assert all(i.record.site == BLOCK for i in gen.interventions)


@pytest.mark.parametrize("steps", [[2, 3], [0], [1, 4, 5]], ids=["two", "prompt-only", "scattered"])
def test_interventions_at_chosen_steps_give_the_hooked_generate_tokens(gpt2, steps) -> None:
    model, prompt, vector = gpt2
    oracle = _steered(model, prompt, vector, steps)
    gen = torchlog.log_generation(model, prompt, intervene={BLOCK: add(vector)}, intervene_steps=steps,
                                  max_new_tokens=STEPS, do_sample=False)
    assert torch.equal(gen.sequences, oracle)
    assert [i.step for i in gen.interventions] == steps
    # The steered activations themselves match the hand-written loop's, step by step.
    by_hand = hand_decode(model, prompt, STEPS, edit=lambda k, h: h + vector if k in steps else h)
    assert torch.equal(by_hand.sequence, oracle)
    for k in range(STEPS):
        torch.testing.assert_close(gen[k, "transformer.h.1"].tensor_contents, by_hand.activations[k],
                                   rtol=1e-5, atol=1e-5)


def test_a_function_of_the_step_patches_each_step_from_another_generation(gpt2) -> None:
    model, prompt, _ = gpt2
    other_prompt = (prompt * 7 + 3) % 99 + 1
    clean = torchlog.log_generation(model, other_prompt, layers_to_save=[BLOCK], max_new_tokens=STEPS,
                                    do_sample=False)
    # Patch step 1 and 2 of this generation with the other's block output at the same steps.
    patched_steps = {1, 2}
    gen = torchlog.log_generation(
        model, prompt, intervene=lambda step: {BLOCK: patch_from(clean.steps[step])} if step in patched_steps else None,
        max_new_tokens=STEPS, do_sample=False)
    sources = {k: clean[k, BLOCK].tensor_contents for k in patched_steps}
    oracle = hooked_generate(model, prompt, BLOCK, lambda call, h: sources[call] if call in sources else h,
                             max_new_tokens=STEPS, do_sample=False)
    assert torch.equal(gen.sequences, oracle)
    assert [i.step for i in gen.interventions] == sorted(patched_steps)


def test_a_site_found_on_a_probe_runs_each_step_again_from_the_cache_it_was_given() -> None:
    # A model of its own: the shared one may already have a probe kept by the tests before,
    # which would serve the site without a second run.
    model, prompt = tiny_gpt2()
    torch.manual_seed(2)
    bias = torch.randn(100) * 3.0
    # -2 is the last op before the output (the lm_head's linear): a position from the end is
    # placed on a probe, so a step runs the model more than once over the same KV cache.
    runs = []
    handle = model.transformer.register_forward_pre_hook(lambda m, a: runs.append(1))
    try:
        gen = torchlog.log_generation(model, prompt, intervene={-2: add(bias)}, max_new_tokens=STEPS,
                                      do_sample=False)
    finally:
        handle.remove()
    assert len(runs) > STEPS
    assert all(i.record.label == gen.steps[i.step][-2].label for i in gen.interventions)
    oracle = hooked_generate(model, prompt, "lm_head", lambda call, h: h + bias,
                             max_new_tokens=STEPS, do_sample=False)
    assert torch.equal(gen.sequences, oracle)
