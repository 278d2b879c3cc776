"""DOT source of tiny models against golden files (vis/dot.py and everything feeding it).

The golden files in tests/vis/golden/ are the DOT text each case must produce: exactly, except
that printed floats may differ by rounding (tests/golden_compare.py).
After an intended change to the drawing (or to labels in capture), regenerate them with

    TORCHLOG_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/vis/test_vis_golden.py

then review `git diff tests/vis/golden` before committing: every changed line is a
change users will see.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import torchlog
from tests.golden_compare import check_golden
from tests.models import Branching, CreatedInside, Nested, ReusedModule, SimpleRecurrent, TrainEval

GOLDEN = Path(__file__).parent / "golden"


class FailsInside(nn.Module):
    """Raises in its second Linear (shape mismatch): gives a partial history."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 3)
        self.second = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x)) + x


def _log(model_cls: Callable[[], nn.Module], *shape: int, **kwargs) -> torchlog.ModelHistory:
    torch.manual_seed(0)
    model = model_cls().eval()
    return torchlog.log_forward_pass(model, torch.rand(*shape), random_seed=0, **kwargs)


CASES = {
    "feedforward_unrolled": (lambda: _log(TrainEval, 5, 4), {}),
    "feedforward_buffers_topdown": (lambda: _log(TrainEval, 5, 4),
                                    {"show_buffers": True, "direction": "topdown"}),
    "branching_unrolled": (lambda: _log(Branching, 2, 4), {}),
    "nested_unrolled": (lambda: _log(Nested, 2, 4), {}),
    "nested_depth2": (lambda: _log(Nested, 2, 4), {"nesting_depth": 2}),
    "nested_depth1_leftright": (lambda: _log(Nested, 2, 4),
                                {"nesting_depth": 1, "direction": "leftright"}),
    "recurrent_unrolled": (lambda: _log(SimpleRecurrent, 6, 5), {}),
    "recurrent_rolled": (lambda: _log(SimpleRecurrent, 6, 5), {"mode": "rolled"}),
    "reused_rolled_depth1": (lambda: _log(ReusedModule, 2, 4), {"mode": "rolled", "nesting_depth": 1}),
    "created_inside_unrolled": (lambda: _log(CreatedInside, 2, 4), {}),
    "partial_unrolled": (lambda: _log(FailsInside, 2, 4, on_error="return"), {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_dot_matches_golden(case: str) -> None:
    make_history, options = CASES[case]
    source = make_history().to_dot(**options)
    check_golden(GOLDEN / f"{case}.gv", source)


def test_dot_is_identical_across_processes() -> None:
    """A fresh interpreter (new ids, new hash seed, another random seed) gives the same text."""
    code = (
        "import sys, torch, torchlog\n"
        "from tests.models import Nested\n"
        "torch.manual_seed(0)\n"
        "h = torchlog.log_forward_pass(Nested().eval(), torch.rand(2, 4), random_seed=123)\n"
        "sys.stdout.write(h.to_dot(nesting_depth=2))\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONHASHSEED": "7", "PYTHONPATH": str(root)}
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, cwd=root, check=True)
    here = _log(Nested, 2, 4).to_dot(nesting_depth=2)
    assert child.stdout == here
