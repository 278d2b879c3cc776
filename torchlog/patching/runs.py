"""Patched runs: the corrupted input run with clean values written into chosen passes, as cheaply as possible.

A pass that is a module call's output is patched by a forward hook on that module (the
way a plain-PyTorch user would, and the cheapest); any other pass by the lean capture,
which counts ops as capture numbers them and replaces the output of the chosen calls
(`capture/lean.py`). Hooks are removed and the mode popped however the run ends.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from torchlog.capture.lean import run_lean
from torchlog.capture.nesting import find_tensors
from torchlog.capture.plan import Act, Firing, OpPlan, substitute
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
    by_module: dict[str, dict[int, list[Edit]]] = {}
    by_call: dict[tuple[int, int], list[Edit]] = {}
    for edit in edits:
        if edit.target.module_call is not None:
            address, call = edit.target.module_call
            by_module.setdefault(address, {}).setdefault(call, []).append(edit)
        else:
            by_call.setdefault(edit.target.call, []).append(edit)
    reached: set[int] = set()
    handles = [named_modules[address].register_forward_hook(_hook(calls, reached))
               for address, calls in by_module.items()]
    try:
        with prefix.serving(reached) if prefix is not None else contextlib.nullcontext():
            output = _run(model, args, kwargs, by_call, reached, calls)
    finally:
        for handle in handles:
            handle.remove()
    missing = [edit for edit in edits if id(edit) not in reached]
    if missing:
        record = missing[0].target.record
        raise InterventionError(
            f"the patched run never reached pass {record.label!r} (site {missing[0].target.site!r}): "
            "the corrupted input ran other ops or module calls than the clean one there")
    return output


def _run(model: nn.Module, args: tuple, kwargs: dict, by_call: dict[tuple[int, int], list[Edit]],
         reached: set[int], calls: list | None) -> Any:
    """The forward: plain (module hooks do the edits) or lean, editing the calls `by_call`
    names and appending its calls to `calls`."""
    if not by_call and calls is None:
        return model(*args, **kwargs)
    plan = OpPlan(at_calls={position: (edits[0].target.record.op_index, edits[0].target.record.label,
                                       (Act(0, edits[0].target.site, _lean_action(edits, reached)),))
                            for position, edits in by_call.items()})
    lean = run_lean(model, args, kwargs, {}, plan=plan)
    if calls is not None:
        calls.extend(lean.calls)
    return lean.output


def _hook(calls: dict[int, list[Edit]], reached: set[int]) -> Callable:
    seen = [0]

    def patch(module: nn.Module, args: Any, output: Any) -> Any:
        seen[0] += 1
        edits = calls.get(seen[0])
        if not edits:
            return None
        tensors = find_tensors(output)
        if not tensors:
            return None
        old = new = tensors[0][0]
        # Reached first: from here on a prefix serves nothing. Under the lean capture or a
        # prefix, a patch's ops are not the model's.
        reached.update(id(edit) for edit in edits)
        with torch._C.DisableTorchFunction():
            for edit in edits:
                new = edit.fn(new)
        return substitute(output, old, new)

    return patch


def _lean_action(edits: list[Edit], reached: set[int]) -> Callable[[torch.Tensor, Firing], torch.Tensor]:
    def act(value: torch.Tensor, firing: Firing) -> torch.Tensor:
        record = edits[0].target.record
        if firing.func_name != record.func_name:  # a call number that moved: never the wrong op
            raise InterventionError(
                f"the patched run's call at {record.label!r}'s position is {firing.func_name!r}, not "
                f"{record.func_name!r}: the run's ops differ from the clean run's before it")
        reached.update(id(edit) for edit in edits)
        with torch._C.DisableTorchFunction():
            for edit in edits:
                value = edit.fn(value)
        return value

    return act
