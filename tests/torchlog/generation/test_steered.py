"""run_generation: steered tokens through torchlog.run per step, equal to a hooked `generate`
and to log_generation's, with each firing's step."""
from __future__ import annotations

import pytest
import torch

import torchlog
from torchlog.errors import InterventionError
from torchlog.generation import run_generation
from torchlog.interventions import add

from .decoding import hooked_generate, steering_gpt2

pytestmark = pytest.mark.heavy
BLOCK = "transformer.h.0"
STEPS = 6


@pytest.fixture(scope="module")
def gpt2():
    return steering_gpt2()


@pytest.mark.parametrize("steps", [None, [0], [2, 3, 5]], ids=["every", "prompt-only", "chosen"])
def test_steered_tokens_equal_the_hooked_generate_and_the_logged_generation(gpt2, steps) -> None:
    model, prompt, vector = gpt2
    chosen = range(STEPS) if steps is None else steps
    oracle = hooked_generate(model, prompt, BLOCK, lambda call, h: h + vector if call in chosen else h,
                             max_new_tokens=STEPS, do_sample=False)
    steered = run_generation(model, prompt, intervene={BLOCK: add(vector)}, intervene_steps=steps,
                             max_new_tokens=STEPS, do_sample=False)
    assert torch.equal(steered.sequences, oracle)
    assert torch.equal(steered.tokens, oracle[:, prompt.shape[1]:])
    assert [i.step for i in steered.interventions] == list(chosen) and steered.num_steps == STEPS
    assert all(i.record.label == f"{BLOCK}:1" for i in steered.interventions)
    logged = torchlog.log_generation(model, prompt, intervene={BLOCK: add(vector)}, intervene_steps=steps,
                                     layers_to_save=None, max_new_tokens=STEPS, do_sample=False)
    assert torch.equal(logged.sequences, oracle)
    assert "forward" not in vars(model)


def test_sampling_with_a_seed_and_a_site_found_on_a_probe(gpt2) -> None:
    model, prompt, _ = gpt2
    torch.manual_seed(2)
    bias = torch.randn(100) * 3.0
    torch.manual_seed(7)
    oracle = hooked_generate(model, prompt, "lm_head", lambda call, h: h + bias, max_new_tokens=STEPS,
                             do_sample=True, top_k=0)
    torch.manual_seed(7)
    steered = run_generation(model, prompt, intervene={-2: add(bias)}, max_new_tokens=STEPS,
                             do_sample=True, top_k=0)
    assert torch.equal(steered.sequences, oracle)


def test_a_site_that_acts_nowhere_is_an_error_with_the_steps_done(gpt2) -> None:
    model, prompt, vector = gpt2
    with pytest.raises(InterventionError, match="transformer.h.9") as caught:
        run_generation(model, prompt, intervene={"transformer.h.9": add(vector)}, max_new_tokens=3)
    assert caught.value.torchlog_generation.num_steps == 0
    assert "forward" not in vars(model)


def test_steps_at_module_sites_take_no_argument_snapshot_and_a_second_run_is_refused(gpt2, monkeypatch) -> None:
    """A step acted on by module hooks alone runs the model once, so the KV cache it is given
    is not walked; a step said to run once that calls the model again is an error, not a
    run on a cache the first call already appended to."""
    from torchlog.errors import GenerationError
    from torchlog.generation import stepping

    model, prompt, vector = gpt2
    taken, snapshot = [], stepping.ArgumentState
    monkeypatch.setattr(stepping, "ArgumentState", lambda *a: taken.append(a) or snapshot(*a))
    run_generation(model, prompt, intervene={BLOCK: add(vector)}, max_new_tokens=4, do_sample=False)
    # Only the first step, which prepares the sites, is snapshotted (before and after its run).
    assert [args[1]["input_ids"].shape[1] for args in taken] == [prompt.shape[1]] * 2
    taken.clear()
    run_generation(model, prompt, intervene={-2: add(torch.zeros(100))}, max_new_tokens=2, do_sample=False)
    assert len(taken) >= 4  # a label site found on a probe: two runs a step, the cache put back between

    def twice(args: list, kwargs: dict, step: int) -> tuple:
        model(*args, **kwargs)
        model(*args, **kwargs)
        return ()
    with pytest.raises(GenerationError, match="step 0 was to call the model once and called it again"):
        with stepping.StepLogger(model, twice, lambda step: True):
            model.generate(prompt, max_new_tokens=1, do_sample=False)
    assert "forward" not in vars(model)


def test_module_hooks_are_registered_once_for_the_steps_after_the_first(gpt2, monkeypatch) -> None:
    """From the second step on, the sites' hooks stay in place (Runner.span): registered twice
    in a generation of STEPS steps, not at every step, and gone once it ends, also when it raises."""
    from torchlog.capture import module_acts

    model, prompt, vector = gpt2
    entered, enter = [], module_acts.ExitActs.__enter__
    monkeypatch.setattr(module_acts.ExitActs, "__enter__", lambda self: entered.append(1) or enter(self))
    block = model.get_submodule(BLOCK)
    steered = run_generation(model, prompt, intervene={BLOCK: add(vector)}, max_new_tokens=STEPS, do_sample=False)
    assert len(entered) == 2 and [i.step for i in steered.interventions] == list(range(STEPS))
    assert not block._forward_hooks and not block._forward_pre_hooks

    def fails_at_step_3(module, args, output):
        if len(calls) == 3:
            raise RuntimeError("the model failed")
        calls.append(1)
    calls: list = []
    handle = model.get_submodule("transformer.h.1").register_forward_hook(fails_at_step_3)
    try:
        with pytest.raises(RuntimeError, match="the model failed") as caught:
            run_generation(model, prompt, intervene={BLOCK: add(vector)}, max_new_tokens=STEPS, do_sample=False)
    finally:
        handle.remove()
    assert caught.value.torchlog_generation.num_steps == 3
    assert not block._forward_hooks and not block._forward_pre_hooks and "forward" not in vars(model)
