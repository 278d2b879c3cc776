"""history.module_tree (torchlog/export/module_tree_text.py): print(model)'s hierarchy with what each
module did, against golden files (times, which vary, replaced by TIME)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.torchlog.export.histories import gpt2, logged, nested, partial, recurrent
from tests.golden_compare import check_golden
from tests.models import ReusedModule

GOLDEN = Path(__file__).parent / "golden"
_TIME = re.compile(r"\d+(\.\d+)? (µs|ms|s)(?= ·|$)", re.M)


def _check_golden(text: str, name: str) -> None:
    """Compare with tests/torchlog/export/golden/<name>; TORCHLOG_UPDATE_GOLDEN=1 rewrites it."""
    check_golden(GOLDEN / name, _TIME.sub("TIME", text) + "\n")


@pytest.mark.parametrize("name, make", [
    ("nested", nested),
    ("recurrent", recurrent),
    ("reused", lambda: logged(ReusedModule(), torch.ones(1, 4))),
    ("partial", partial),
])
def test_module_tree_matches_golden(name, make):
    _check_golden(make().module_tree(), f"module_tree_{name}.txt")


def test_lines_follow_print_model():
    model_text = str(ReusedModule())  # ReusedModule(\n  (cell): Linear(...)\n  (act): Tanh()\n)
    tree = logged(ReusedModule(), torch.ones(1, 4)).module_tree().splitlines()
    assert [line.split()[0] for line in tree] == [line.split()[0] for line in model_text.splitlines()]


def test_time_is_the_sum_of_the_ops_inside():
    history = nested()
    line = next(l for l in history.module_tree().splitlines() if l.strip().startswith("(block2)"))
    total = sum(p.elapsed_s for p in history if "block2:1" in p.containing_modules)
    value, unit = _TIME.search(line).group(0).split()
    assert float(value) * {"µs": 1e-6, "ms": 1e-3, "s": 1.0}[unit] == pytest.approx(total, rel=0.01)


@pytest.mark.heavy
def test_gpt2_tree():
    history, model, _ = gpt2()
    tree = history.module_tree()
    names = [l.split(":")[0].strip() for l in tree.splitlines()[1:-1] if l.strip() != ")"]
    assert len(names) == len(list(model.named_modules())) - 1
    assert "(attn_dropout): Dropout" in tree and "not called" in tree  # SDPA path skips it
    assert "(lm_head): Linear" in tree and "out (1, 8, 100)" in tree
