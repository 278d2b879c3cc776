"""Tests of torchlog/capture/module_outputs.py: module outputs copied by hooks equal a full capture's."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.models import IdentityModules, ModuleOutputs, MutatedThroughView, Nested, ReusedModule
from torchlog.capture import CaptureOptions, run_captured
from torchlog.capture.module_outputs import run_module_outputs

CASES = {
    "module_outputs": (ModuleOutputs, (2, 3)),
    "mutated_through_view": (MutatedThroughView, (2, 4)),
    "nested": (Nested, (2, 4)),
    "reused": (ReusedModule, (2, 4)),
    "identity": (IdentityModules, (2, 3)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_call_returns_what_a_full_capture_saved_for_it(name: str) -> None:
    make_model, shape = CASES[name]
    torch.manual_seed(0)
    model, x = make_model(), torch.randn(*shape)
    addresses = [a for a, _ in model.named_modules() if a]
    full = run_captured(model, (x.clone(),), {}, CaptureOptions())
    seen = run_module_outputs(model, (x.clone(),), {}, addresses)
    for (address, call), nodes in full.call_outputs.items():
        copies = seen.returned[address][call - 1]
        assert len(copies) == len(nodes), (address, call)
        for copy, node in zip(copies, nodes):
            assert torch.equal(copy, full.nodes[node].saved), (address, call)
    assert sum(len(calls) for calls in seen.returned.values()) == len(full.call_outputs)


def test_calls_of_the_model_are_noted_in_order_and_other_models_ignored() -> None:
    other = nn.Linear(2, 2)

    class Caller(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.ReLU(), nn.Tanh()

        def forward(self, x):
            other(x)  # not a submodule: not noted
            return self.a(self.b(self.a(x)))

    model = Caller()
    seen = run_module_outputs(model, (torch.ones(1, 2),), {}, [])
    assert seen.calls == [id(model), id(model.a), id(model.b), id(model.a)]


def test_hooks_are_removed_when_forward_raises() -> None:
    model = nn.Sequential(nn.Linear(2, 3), nn.Linear(5, 1))
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        run_module_outputs(model, (torch.ones(1, 2),), {}, ["0", "1"])
    assert not model[0]._forward_hooks and not model[1]._forward_hooks
    assert not torch.nn.modules.module._global_forward_pre_hooks
