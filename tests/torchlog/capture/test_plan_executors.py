"""One plan, every executor: the recorder, the lean capture and module hooks apply an action alike.

A table of action x executor, each against an oracle independent of the engine: the same
edit made by a forward hook on a plain forward (module outputs) or written by hand into
the op's output (ops), so no executor lands untested.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlog
from tests.models import TINY_MODELS
from torchlog.capture import CaptureOptions, run_captured
from torchlog.capture.lean import call_names, run_lean
from torchlog.capture.plan import Act, OpPlan
from torchlog.history import all_passes
from torchlog.interventions import add, replace_with, scale, zero_ablate
from torchlog.model_state import model_kept
from torchlog.patching.runs import Edit, run_patched
from torchlog.patching.sweep_setup import find_targets
from torchlog.sites.resolve import call_positions

ACTIONS = {
    "zero_ablate": lambda shape: zero_ablate(),
    "scale": lambda shape: scale(-2.0),
    "add": lambda shape: add(torch.linspace(-1, 1, shape[-1])),
    "replace_with": lambda shape: replace_with(torch.full(shape, 0.25)),
}


def _oracle(model, x, address, edit):
    handle = model.get_submodule(address).register_forward_hook(lambda m, a, out: edit(out))
    try:
        with torch.no_grad():
            return model(x)
    finally:
        handle.remove()


class TwoLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


@pytest.mark.parametrize("action", sorted(ACTIONS))
@pytest.mark.parametrize("executor", ["recorder", "lean", "hooks", "log_forward_pass"])
def test_every_executor_applies_an_action_as_a_forward_hook_would(action, executor) -> None:
    torch.manual_seed(0)
    model, x = TwoLayer(), torch.randn(3, 4)
    make = ACTIONS[action]
    act = make((3, 5))
    want = _oracle(model, x, "act", lambda out: act(out, None))
    history = torchlog.log_forward_pass(model, x, layers_to_save=None)
    (target,) = find_targets(history, ["act"])
    with torch.no_grad(), model_kept(list(model.named_modules())):
        if executor == "log_forward_pass":
            got = torchlog.log_forward_pass(model, x, intervene={"act": act})[-1].tensor_contents
        elif executor == "hooks":
            got = run_patched(model, (x,), {}, [Edit(target, lambda v: act(v, None))], dict(model.named_modules()))
        else:
            plan = OpPlan(at_calls={target.call: (target.record.op_index, target.record.label, (Act(0, "act", act),))},
                          expected=tuple(p.func_name for p in all_passes(history)))
            if executor == "lean":
                got = run_lean(model, (x,), {}, {}, plan=plan).output
            else:
                captured = run_captured(model, (x,), {}, CaptureOptions(plan=plan))
                got = captured.nodes[-1].saved
    assert torch.equal(got, want)


@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_the_lean_capture_and_the_recorder_act_on_the_same_op_of_every_tiny_model(name) -> None:
    make_model, make_input = TINY_MODELS[name]
    torch.manual_seed(0)
    model, x = make_model(), make_input()
    history = torchlog.log_forward_pass(model, x, layers_to_save=None, random_seed=0)
    passes = all_passes(history)
    positions = call_positions(passes)
    floats = [p for p in passes if p.op_index in positions and p.tensor_meta.dtype.is_floating_point
              and not p.is_inplace]
    assert floats, name
    chosen = floats[len(floats) // 2]
    act = Act(0, chosen.label, scale(0.5))
    plan = OpPlan(at_calls={positions[chosen.op_index]: (chosen.op_index, chosen.label, (act,))},
                  expected=tuple(p.func_name for p in passes))
    args = (x,) if isinstance(x, torch.Tensor) else tuple(x)
    named = list(model.named_modules())
    with torch.no_grad():
        torch.manual_seed(1)
        with model_kept(named):
            captured = run_captured(model, tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args), {},
                                    CaptureOptions(plan=plan), named)
        torch.manual_seed(1)
        with model_kept(named):
            lean = run_lean(model, tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args), {}, {}, plan=plan)
    assert [f.firing.op_index for f in captured.firings] == [chosen.op_index]
    outputs = [n.saved for n in captured.nodes if n.kind == "output"]
    returned = [t for t in (lean.output if isinstance(lean.output, (list, tuple)) else [lean.output])
                if isinstance(t, torch.Tensor)]
    for a, b in zip(outputs, returned):
        assert torch.allclose(a, b, equal_nan=True), name


class StartsEmpty(nn.Module):
    """Fills uninitialised memory: whatever `torch.empty` holds (a NaN, at times) is no result."""

    def forward(self, x):
        c = torch.empty(3)
        torch.add(x, 1, out=c)
        return c * 2


@pytest.mark.parametrize("executor", ["recorder", "lean"])
def test_a_watch_never_stops_at_uninitialised_memory(executor) -> None:
    """A watch that accepts every value stops at the first op after `torch.empty`: what the
    allocator left there is never where a NaN came from (find_nonfinite stopped there when
    the memory held one, at random)."""
    plan = OpPlan(stop_on=lambda t: True)
    model, x = StartsEmpty(), torch.ones(3)
    if executor == "recorder":
        captured = run_captured(model, (x,), {}, CaptureOptions(plan=plan), list(model.named_modules()))
        assert captured.failure is None and captured.nodes[captured.stopped_at].func_name == "add"
    else:
        seen = run_lean(model, (x,), {}, {}, plan=plan)
        assert seen.stopped and call_names(seen.calls) == ["empty", "add"]


def test_find_nonfinite_skips_the_garbage_uninitialised_memory_held() -> None:
    """With deterministic algorithms torch fills `torch.empty` with NaN: find_nonfinite must
    still name the op the NaN came from, not the saved garbage of the empty tensor it filled."""
    class LogOfNegative(StartsEmpty):
        def forward(self, x):
            return super().forward(x).log()

    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)  # its fill_uninitialized_memory makes empty NaN
    try:
        assert torch.isnan(torch.empty(2)).all()
        found = torchlog.find_nonfinite(LogOfNegative(), -torch.ones(3) * 5)
    finally:
        torch.use_deterministic_algorithms(was)
    assert found is not None and found.func_name == "log"
