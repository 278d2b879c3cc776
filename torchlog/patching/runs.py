"""Patched runs: the corrupted input run with clean values written into chosen passes, as cheaply as possible.

The edits become one OpPlan (capture/plan.py): a pass that is a module call's output is
an exit rule, honoured by forward hooks alone when nothing else is edited (the way a
plain-PyTorch user would, and the cheapest: capture/module_acts.py); any other pass is a
call position, honoured by the lean capture (capture/lean.py), which then also honours
the exit rules. Hooks are removed and the mode popped however the run ends.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from torchlog.capture import Act, ExitRule, Firing, OpPlan, run_lean
from torchlog.errors import InterventionError
from torchlog.patching.prefix import Prefix
from torchlog.records import PassRecord

__all__ = ["Edit", "Target", "run_patched"]


@dataclass(frozen=True, slots=True)
class Target:
    """A pass of the clean run that patches write into."""

    site: Any  # the site it was found by, as given
    record: PassRecord  # the pass, in the clean run's metadata-only log
    module_call: tuple[str, int] | None  # (address, call) whose first output it is, or None
    call: tuple[int, int] | None  # (call number, output index) of the op that made it


@dataclass(frozen=True, slots=True)
class Edit:
    """One change in one run: `fn(value) -> new value` at `target`."""

    target: Target
    fn: Callable[[torch.Tensor], torch.Tensor]


def run_patched(model: nn.Module, args: tuple, kwargs: dict, edits: Sequence[Edit],
                named_modules: dict[str, nn.Module], prefix: Prefix | None = None,
                calls: list | None = None) -> Any:
    """Run `model(*args, **kwargs)` with every edit applied; return its output.

    With `prefix`, the calls before the first edit fires are served from the record of an
    earlier run of the same inputs (or recorded, in the first run): `prefix.py`. With
    `calls`, the run goes through the lean capture and appends its calls (`LeanPass.calls`).

    Raises:
        InterventionError: an edited pass was not reached (the run called a module fewer
            times, or ran fewer ops), or an edit's value does not fit.
        Whatever the model raises.
    """
    by_module: dict[tuple[str, int], list[Edit]] = {}
    by_call: dict[tuple[int, int], list[Edit]] = {}
    for edit in edits:
        if edit.target.module_call is not None:
            by_module.setdefault(edit.target.module_call, []).append(edit)
        else:
            by_call.setdefault(edit.target.call, []).append(edit)
    reached: set[int] = set()
    exits: dict[str, tuple[ExitRule, ...]] = {}
    for (address, call), found in by_module.items():
        rule = ExitRule(call, None, Act(0, found[0].target.site, _action(found, reached, None)))
        exits[address] = exits.get(address, ()) + (rule,)
    plan = OpPlan(at_calls={position: (found[0].target.record.op_index, found[0].target.record.label,
                                       (Act(0, found[0].target.site, _action(found, reached, found[0])),))
                            for position, found in by_call.items()}, at_exits=exits)
    with prefix.serving(reached) if prefix is not None else contextlib.nullcontext():
        output = _run(model, args, kwargs, plan, named_modules, calls)
    missing = [edit for edit in edits if id(edit) not in reached]
    if missing:
        record = missing[0].target.record
        raise InterventionError(
            f"the patched run never reached pass {record.label!r} (site {missing[0].target.site!r}): "
            "the corrupted input ran other ops or module calls than the clean one there")
    return output


def _run(model: nn.Module, args: tuple, kwargs: dict, plan: OpPlan, named_modules: dict[str, nn.Module],
         calls: list | None) -> Any:
    """The forward through the lean capture (module hooks alone when only module outputs
    are edited and no call list is asked for), appending its calls to `calls`."""
    lean = run_lean(model, args, kwargs, {}, plan=plan, named_modules=list(named_modules.items()),
                    count=calls is not None)
    if calls is not None:
        calls.extend(lean.calls)
    return lean.output


def _action(edits: list[Edit], reached: set[int], at_op: Edit | None) -> Callable[[torch.Tensor, Firing], torch.Tensor]:
    """One action applying `edits` in order and noting them reached; at an op (`at_op`),
    first checking that the call there is the op the clean run made."""
    def act(value: torch.Tensor, firing: Firing) -> torch.Tensor:
        if at_op is not None and firing.func_name != at_op.target.record.func_name:
            record = at_op.target.record  # a call number that moved: never the wrong op
            raise InterventionError(
                f"the patched run's call at {record.label!r}'s position is {firing.func_name!r}, not "
                f"{record.func_name!r}: the run's ops differ from the clean run's before it")
        # Reached first: from here on a prefix serves nothing.
        reached.update(id(edit) for edit in edits)
        for edit in edits:
            value = edit.fn(value)
        return value

    return act
