"""The plan capture acts on: which ops and module outputs get which actions, and where to stop.

Capture knows positions only. The layers above it (torchlog/interventions) turn labels,
module addresses and selectors into an `OpPlan` once, and the recorder applies it at one
place per kind of site: when an op returns (`at_calls`, `at_ops`) and when a module
returns (`at_exits`). Saving is the other action capture applies per op; it stays the
`save_all`/`save_indices` test of the capture options, so a pass without a plan pays
nothing more than one attribute test per op.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch


__all__ = ["Act", "OpView", "ExitRule", "Firing", "OpPlan", "OpRule", "StopCapture", "max_change", "out_of_order",
           "substitute", "unfit"]


class OpView(NamedTuple):
    """What is known of a pass when its op returns: what `where` predicates receive.

    The pass label is not known yet (labels are given after the pass, when loops are
    found); `op_index` and `module_path` place the pass instead.
    """

    func_name: str  # 'linear', '__add__', 'softmax'
    layer_type: str  # the label's type part: 'linear', 'add', 'softmax'
    module_path: tuple[tuple[str, int], ...]  # enclosing module calls, outermost first
    shape: tuple[int, ...]
    dtype: torch.dtype
    op_index: int  # position among every pass of the run (inputs and buffers included)
    output_index: int  # which output of a multi-output op (0 for most)

    @property
    def module(self) -> str:
        """The innermost enclosing module's address ('' at the model's top level)."""
        return self.module_path[-1][0] if self.module_path else ""


class Firing(NamedTuple):
    """Where an action fires: what the action is told beside the value."""

    site: Any  # the site as the user gave it
    op_index: int  # the pass's position among every pass of the run
    func_name: str  # the op that produced the value
    module_call: tuple[str, int] | None  # (address, call) when it fires on a module's output
    label: str | None  # the pass label, when known before the pass (label sites)


@dataclass(frozen=True, slots=True)
class Act:
    """One (site, action) pair of the user's `intervene`, in the user's order."""

    number: int  # position in `intervene`: actions reaching one op run in this order
    site: Any  # as given, for messages and records
    action: Callable[[torch.Tensor, Firing], torch.Tensor]


@dataclass(frozen=True, slots=True)
class OpRule:
    """An op-stage site: tested on each op as it returns."""

    test: Callable[[OpView], bool]
    act: Act


@dataclass(frozen=True, slots=True)
class ExitRule:
    """An exit-stage site on one module: acts on the output of its calls."""

    call: int | None  # the call number it acts on; None: every call
    test: Callable[[OpView], bool] | None  # an op-stage condition on the output's op, or None
    act: Act


@dataclass(frozen=True, slots=True)
class OpPlan:
    """Actions by position, resolved before the pass; frozen, shared by every run of a call."""

    # (call number, output index) -> (the node index the logged pass gave it, its label, acts)
    at_calls: Mapping[tuple[int, int], tuple[int, str, tuple[Act, ...]]] = field(default_factory=dict)
    at_ops: tuple[OpRule, ...] = ()
    at_exits: Mapping[str, tuple[ExitRule, ...]] = field(default_factory=dict)
    # The logged pass's op names by node index, which the pass must repeat up to each
    # `at_calls` site (and up to `stop_node`) before acting on it.
    expected: tuple[str, ...] = ()
    stop_node: int | None = None  # end the pass once this node is recorded
    stop_exit: tuple[str, int] | None = None  # end the pass once this module call returns
    # End the pass once the first op one of whose output tensors this accepts is recorded,
    # decided as the pass runs (find_nonfinite's stop at the first NaN or Inf).
    stop_on: Callable[[torch.Tensor], bool] | None = None

    @property
    def acts(self) -> bool:
        """Whether the plan changes any value (a plan may only stop)."""
        return bool(self.at_calls or self.at_ops or self.at_exits)


class StopCapture(BaseException):
    """Ends a captured pass from inside forward, past any `except Exception` of the model.

    Without `error`, the pass was asked to stop there (`stop_after`): it ends as if forward
    had returned nothing. With `error` (an InterventionError), the pass failed at that
    point, and the error is what the caller raises.
    """

    def __init__(self, error: Exception | None = None) -> None:
        super().__init__()
        self.error = error


def substitute(value: Any, old: torch.Tensor, new: torch.Tensor) -> Any:
    """`value` (a module's output) with tensor `old` replaced by `new` wherever it occurs:
    lists, tuples, named tuples and dicts are rebuilt, other containers (transformers'
    ModelOutput, dataclasses) are copied with the field replaced."""
    if value is old:
        return new
    kind = type(value)
    if kind is tuple or kind is list:
        return kind(substitute(v, old, new) for v in value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return kind(*(substitute(v, old, new) for v in value))
    if kind is dict:
        return {k: substitute(v, old, new) for k, v in value.items()}
    fields = getattr(value, "__dataclass_fields__", None)
    if fields is not None:  # dataclasses, and transformers' ModelOutput (also a dict)
        changes = {name: substitute(getattr(value, name), old, new) for name in fields
                   if fields[name].init}
        return dataclasses.replace(value, **changes)
    if isinstance(value, dict):
        copy = value.copy()
        for key, item in value.items():
            copy[key] = substitute(item, old, new)
        return copy
    return value


def out_of_order(first: Any, fired: Any, op_index: int, func_name: str, module_call: tuple[str, int]) -> str:
    """Why an exit action (site `first`) listed before an action that already changed the
    same value (site `fired`, at the op or at an inner module's exit) cannot act: the pass
    cannot apply them in `intervene`'s order, and the other order would be silent."""
    address, number = module_call
    return (f"sites {first!r} and {fired!r} both change op {op_index} ({func_name!r}, output of "
            f"{address}:{number}), and {first!r} comes first in intervene, but it acts when module "
            f"{address!r} returns, after {fired!r} already acted; list {first!r} after {fired!r}, or "
            "name both sites the same way")


def unfit(new: Any, value: torch.Tensor) -> str | None:
    """Why `new` cannot replace `value` (in words), or None when it can."""
    if not isinstance(new, torch.Tensor):
        return f"returned {type(new).__name__} {new!r:.60}, not a tensor"
    if new.shape != value.shape:
        return f"returned shape {tuple(new.shape)} for a value of shape {tuple(value.shape)}"
    if new.dtype != value.dtype:
        return f"returned dtype {new.dtype} for a value of dtype {value.dtype}"
    if new.device != value.device:
        return f"returned a tensor on {new.device} for a value on {value.device}"
    return None


def max_change(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor | float:
    """The largest absolute elementwise change; 0.0 for empty tensors, NaN where either is NaN.

    A 0-d tensor on the values' device, read with `float()` once the pass is over: reading it
    as the pass runs would make the CPU wait for a GPU's queued work at every firing.
    """
    if new is old or old.numel() == 0:
        return 0.0
    with torch.no_grad():
        a, b = old.detach(), new.detach()
        if not (a.is_floating_point() or a.is_complex()):
            a, b = a.double(), b.double()
        diff = (b - a).abs()
        same = (a == b) | (a.isnan() & b.isnan())  # an unchanged NaN or infinity changed nothing
        return diff.masked_fill(same, 0).max()
