"""The model's own forward hooks and pre-hooks run once per step, as under a plain
`generate`: not once around torchlog's run and again around the call from generate."""
from __future__ import annotations

import pytest
import torch

import torchlog
from torchlog.generation import run_generation
from torchlog.interventions import scale

from .decoding import tiny_gpt2

pytestmark = pytest.mark.heavy
STEPS = 4


def _shift_ids(module, args, kwargs):
    """A pre-hook that edits the input: applied twice, it reads other tokens."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    shifted = (ids + 1) % 100
    if "input_ids" in kwargs:
        return args, {**kwargs, "input_ids": shifted}
    return (shifted, *args[1:]), kwargs


def _bias_logits(module, args, output):
    """A forward hook returning a new output object, its logits biased toward token 7."""
    bias = torch.zeros(output.logits.shape[-1])
    bias[7] = 5.0
    return type(output)(logits=output.logits + bias, past_key_values=output.past_key_values)


@pytest.mark.parametrize("runner", ["log_generation", "run_generation"])
def test_hooks_on_the_model_run_once_per_step_and_their_edits_reach_generate(runner) -> None:
    model, prompt = tiny_gpt2()
    calls: list[str] = []
    handles = [model.register_forward_pre_hook(lambda m, a, k: calls.append("pre"), with_kwargs=True),
               model.register_forward_pre_hook(_shift_ids, with_kwargs=True),
               model.register_forward_hook(_bias_logits),
               model.register_forward_hook(lambda m, a, o: calls.append("post"))]
    try:
        oracle = model.generate(prompt, max_new_tokens=STEPS, do_sample=False)
        assert calls == ["pre", "post"] * STEPS
        calls.clear()
        if runner == "log_generation":
            found = torchlog.log_generation(model, prompt, max_new_tokens=STEPS, do_sample=False).sequences
        else:
            found = run_generation(model, prompt, intervene={"transformer.h.0": scale(1.0)},
                                   max_new_tokens=STEPS, do_sample=False).sequences
        assert calls == ["pre", "post"] * STEPS
        assert torch.equal(found, oracle)
        # The hooks are the model's again, in their order, and nothing of torchlog's is left.
        assert list(model._forward_pre_hooks) == [h.id for h in handles[:2]]
        assert list(model._forward_hooks) == [h.id for h in handles[2:]]
    finally:
        for handle in handles:
            handle.remove()
    assert "forward" not in vars(model)
    without = model.generate(prompt, max_new_tokens=STEPS, do_sample=False)
    assert not torch.equal(without, oracle)  # the hooks did change the tokens
