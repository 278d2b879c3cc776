"""PassRecord.elapsed_s is the op's own time: the torch call, never the capture work around it.

The recorder's clock is replaced by one that moves only when something moves it, so these
tests measure nothing and cannot depend on the machine's speed or load: saving (through a
postfunc that moves the clock 50 ms) is outside every op's window, and the op's own work
(`Tensor.apply_` calling back into Python, 1 ms per element) is inside its own.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlog
from torchlog.capture import profile, recorder

SAVE_NS = 50_000_000  # what one save costs on the fake clock
ELEMENT_NS = 1_000_000  # what apply_ costs per element on the fake clock


class _Clock:
    """perf_counter_ns that advances 1 µs per read, and by `advance` when told."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        self.now += 1_000
        return self.now

    def advance(self, ns: int) -> None:
        self.now += ns


class _Mixed(nn.Module):
    """A tiny op, a Python functional with one op (softmax), one with several (normalize),
    a module, and an op whose own work is a Python callback per element (apply_)."""

    def __init__(self, clock: _Clock) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.clock = clock

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.softmax(self.lin(x + 1), dim=-1)
        y = nn.functional.normalize(y, dim=-1)
        return y.detach().clone().apply_(self._slow_identity)

    def _slow_identity(self, value: float) -> float:
        self.clock.advance(ELEMENT_NS)
        return value


@pytest.mark.parametrize("options", [{}, {"save_function_args": True}, {"profile": True}],
                         ids=["lean", "function-args", "profile"])
def test_saving_is_outside_the_op_time_and_the_ops_own_work_inside(monkeypatch, options):
    clock = _Clock()
    monkeypatch.setattr(recorder, "perf_counter_ns", clock)
    monkeypatch.setattr(profile, "perf_counter_ns", clock)
    saves = []

    def slow_save(t: torch.Tensor) -> torch.Tensor:
        saves.append(clock.now)
        clock.advance(SAVE_NS)
        return t.clone()

    x = torch.randn(2, 4)
    history = torchlog.log_forward_pass(_Mixed(clock), x, activation_postfunc=slow_save,
                                        random_seed=0, **options)
    ops = [p for p in history if p.kind == "op"]
    assert len(saves) >= len(ops) >= 8  # every op was saved through the slow postfunc
    (applied,) = [p for p in ops if p.func_name == "apply_"]
    own = x.numel() * ELEMENT_NS / 1e9  # 8 callbacks, 1 ms each, run by apply_ itself
    assert own <= applied.elapsed_s < own + SAVE_NS / 2e9
    for record in ops:
        if record is not applied:
            assert record.elapsed_s < SAVE_NS / 2e9, (record.label, record.elapsed_s)
