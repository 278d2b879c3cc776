"""What a model carries from call to call is as under a plain `generate`: its own forward
hooks and pre-hooks run once per step (not once around torchlog's run and again around the
call from generate), and state it keeps in buffers carries from step to step (each logged
pass puts buffers back), while the model is left as it was after the generation."""
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


class CountingDecoder(torch.nn.Module):
    """Next token: the last one plus a step counter kept in buffers, one written in place and
    one reassigned, so the tokens depend on every earlier call."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))
        self.register_buffer("shift", torch.zeros((), dtype=torch.long))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.shift = self.shift + 2
        return torch.nn.functional.one_hot((ids + self.calls.long() + self.shift) % 10, 10).float()


def _greedy(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    for _ in range(STEPS):
        ids = torch.cat([ids, model(ids)[:, -1:].argmax(-1)], dim=-1)
    return ids


@pytest.mark.parametrize("runner", ["log_generation", "run_generation", "run_generation, label site"])
def test_state_kept_in_buffers_carries_from_step_to_step(runner) -> None:
    prompt = torch.tensor([[4]])
    oracle = _greedy(CountingDecoder(), prompt)
    model = CountingDecoder()
    calls, shift = model.calls, model.shift
    if runner == "log_generation":
        found = torchlog.log_generation(model, prompt, decode=_greedy).sequences
    else:  # an op selector runs once a step; a label is checked on a probe (two runs a step,
        # the probe's writes undone before the run that counts)
        site = torchlog.select.func("float") if runner == "run_generation" else "float_1_10"
        found = run_generation(model, prompt, decode=_greedy, intervene={site: scale(1.0)}).sequences
    assert torch.equal(found, oracle), (found, oracle)
    # Left as it was: the same buffers, holding what they held.
    assert model.calls is calls and float(calls) == 0 and model.shift is shift and int(shift) == 0
