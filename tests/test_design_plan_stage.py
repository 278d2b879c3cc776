"""docs/design.md section 4 (the plan stage) checked against the code: one way to apply an
action, one check of a run's ops, one copy of module hooks for plans, one list of random
ops, and the lean capture refusing what it cannot honour, naming the field."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

from torchlog.capture.lean import run_lean
from torchlog.capture.plan import Act, ExitRule, OpPlan, OpRule
from torchlog.errors import InterventionError
from torchlog.interventions import scale

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [p for folder in ("torchlog", "storage", "vis") for p in (ROOT / folder).rglob("*.py")]
EXECUTORS = ["torchlog/capture/recorder.py", "torchlog/capture/lean.py", "torchlog/capture/module_acts.py",
             "torchlog/replay/counterfactual.py"]


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _imported_names(path: Path) -> set[str]:
    return {alias.name for node in ast.walk(_tree(path)) if isinstance(node, ast.ImportFrom)
            for alias in node.names}


def test_every_executor_applies_actions_with_run_action_and_nothing_else_calls_an_action() -> None:
    defined = [p for p in SOURCES if any(isinstance(n, ast.FunctionDef) and n.name == "run_action"
                                         for n in ast.walk(_tree(p)))]
    assert [p.relative_to(ROOT).as_posix() for p in defined] == ["torchlog/capture/plan.py"]
    for name in EXECUTORS:
        assert "run_action" in _imported_names(ROOT / name), f"{name} does not apply actions with run_action"
    # No other module calls an action (`act.action(...)`): run_action is the one place.
    callers = []
    for path in SOURCES:
        for node in ast.walk(_tree(path)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "action"
                    and path.relative_to(ROOT).as_posix() != "torchlog/capture/plan.py"):
                callers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert callers == [], f"actions applied outside capture/plan.py's run_action: {callers}"


def test_the_executors_that_act_at_positions_check_the_run_with_first_difference() -> None:
    for name in ("torchlog/capture/recorder.py", "torchlog/capture/lean.py"):
        assert "first_difference" in _imported_names(ROOT / name), name


def test_plans_reach_module_hooks_through_one_module() -> None:
    """Patched runs and torchlog.run register no hooks of their own: capture/module_acts.py does."""
    for name in ("torchlog/patching/runs.py", "torchlog/intervened.py", "torchlog/capture/lean.py"):
        text = (ROOT / name).read_text()
        assert "register_forward_hook" not in text and "register_forward_pre_hook(" not in text.replace(
            "register_module_forward_pre_hook(", ""), name


def test_one_list_of_random_ops() -> None:
    holders = []
    for path in SOURCES:
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Set) and any(isinstance(e, ast.Constant) and e.value == "bernoulli"
                                                 for e in node.elts):
                holders.append(path.relative_to(ROOT).as_posix())
    assert holders == ["torchlog/sites/random_ops.py"], holders


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x):
        return torch.relu(self.fc(x))


@pytest.mark.parametrize("plan, field", [
    (OpPlan(at_nodes={2: ("relu", (Act(0, "relu_1_2", scale(1.0)),))}), "at_nodes"),
    (OpPlan(at_ops=(OpRule(lambda op: True, Act(0, "where", scale(1.0)), True),)), "at_ops"),
    (OpPlan(save_exits={"fc": ()}), "save_exits"),
    (OpPlan(stop_node=2), "stop_node"),
    (OpPlan(at_exits={"fc": (ExitRule(None, lambda op: True, Act(0, "fc", scale(1.0))),)}), "at_exits"),
])
def test_the_lean_capture_refuses_a_field_it_cannot_honour_naming_it(plan, field) -> None:
    ran = []
    model = _Net()
    model.register_forward_pre_hook(lambda m, a: ran.append(1))
    with pytest.raises(InterventionError, match=rf"cannot honour this plan: {field}"):
        run_lean(model, (torch.ones(1, 2),), {}, {}, plan=plan)
    assert ran == []  # refused before the model ran
