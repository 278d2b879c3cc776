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
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from torchlog.errors import InterventionError


__all__ = ["Act", "ExitRule", "Firing", "FiringRecord", "OpPlan", "OpRule", "OpView", "StopCapture",
           "deliver", "first_difference", "is_written", "max_change", "out_of_order", "run_action",
           "inputs_missing", "outputs_missing", "substitute", "unfit", "unreachable"]


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
    # For a module site: (which tensor of the module's return value, how many it returned).
    module_output: tuple[int, int] | None = None
    # For a module-input site: (which tensor of the module's arguments, how many it got).
    module_input: tuple[int, int] | None = None


class FiringRecord(NamedTuple):
    """One action applied during a pass."""

    number: int  # the (site, action) pair's position in `intervene`
    firing: Firing  # where it fired
    action: Any  # the action applied
    max_abs_change: Any  # largest absolute change it made (NaN-aware): a 0-d tensor, read after the pass
    before: Any = None  # the value before the action (summarised once the pass is over)


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
    # Whether the test may read the op's position (`where` predicates): an executor that
    # does not number every pass (the lean capture) refuses such a rule.
    uses_position: bool = True


@dataclass(frozen=True, slots=True)
class ExitRule:
    """An exit-stage site on one module: acts on the output of its calls."""

    call: int | None  # the call number it acts on; None: every call
    test: Callable[[OpView], bool] | None  # an op-stage condition on the output's op, or None
    act: Act
    output: int = 0  # which tensor of the returned structure, in `find_tensors` order


@dataclass(frozen=True, slots=True)
class OpPlan:
    """Actions by position, resolved before the pass; frozen, shared by every run of a call."""

    # (call number, output index) -> (the node index the logged pass gave it, its label, acts)
    at_calls: Mapping[tuple[int, int], tuple[int, str, tuple[Act, ...]]] = field(default_factory=dict)
    at_ops: tuple[OpRule, ...] = ()
    at_exits: Mapping[str, tuple[ExitRule, ...]] = field(default_factory=dict)
    # module address -> rules acting on what its calls receive (`ExitRule.output`: which
    # tensor of the arguments), before its forward runs.
    at_entries: Mapping[str, tuple[ExitRule, ...]] = field(default_factory=dict)
    # The logged pass's op names by node index, which the pass must repeat up to each
    # `at_calls` site (and up to `stop_node`) before acting on it.
    expected: tuple[str, ...] = ()
    stop_node: int | None = None  # end the pass once this node is recorded
    # With a guessed stop (a label's node index, no logged pass to check against): the
    # layer type that node must have, else the pass does not stop there.
    stop_type: str | None = None
    stop_exit: tuple[str, int] | None = None  # end the pass once this module call returns
    # End the pass once the first op one of whose output tensors this accepts is recorded,
    # decided as the pass runs (find_nonfinite's stop at the first NaN or Inf).
    stop_on: Callable[[torch.Tensor], bool] | None = None
    # The logged pass's op names by call number (from 1; `expected` is by node index): what
    # an executor that counts calls, not nodes, checks before acting at `at_calls`.
    expected_calls: tuple[str, ...] = ()
    stop_call: int | None = None  # `stop_node` as a call number, for executors that count calls
    # Saving decided while the pass runs: the outputs of these module calls (address ->
    # call numbers, () for every call), and of the ops these tests accept.
    save_exits: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    save_ops: tuple[Callable[[OpView], bool], ...] = ()
    # Label sites guessed while the pass runs, for a model with no loop before them:
    # node index -> (layer type the label names, acts). The API checks on the finished
    # history that each label names the node acted on, else runs the pass again.
    at_nodes: Mapping[int, tuple[str, tuple[Act, ...]]] = field(default_factory=dict)

    @property
    def acts(self) -> bool:
        """Whether the plan changes any value (a plan may only stop)."""
        return bool(self.at_calls or self.at_ops or self.at_exits or self.at_nodes or self.at_entries)


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
    a, b = old.detach(), new.detach()  # no graph: nothing here is differentiated
    if not (a.is_floating_point() or a.is_complex()):
        a, b = a.double(), b.double()
    diff = (b - a).abs()
    if a.device.type == "cpu":  # reading a CPU value waits for nothing: the common case in two ops
        largest = diff.max()
        if math.isfinite(largest):  # neither value holds a NaN or an infinity
            return largest
    same = (a == b) | (a.isnan() & b.isnan())  # an unchanged NaN or infinity changed nothing
    return diff.masked_fill(same, 0).max()


def is_written(t: torch.Tensor, args: tuple, kwargs: Mapping, writes_first_arg: bool) -> bool:
    """Whether op output `t` is memory the op wrote into (an in-place name, `out=`,
    `inplace=True`, `t[i] = v`, `t.data = v`, a write through a view): the model may hold
    that tensor and never read the op's result, so an edit must be written into it."""
    return writes_first_arg or "out" in kwargs or any(t is a for a in args)


def deliver(out: Any, t: torch.Tensor, new: torch.Tensor, written: bool, args: tuple = ()) -> Any:
    """What the model gets from an op that returned `out`, once its output `t` is edited to
    `new`: `out` itself with `new` written into `t` (an op that wrote into `t`), else `out`
    with `t` replaced by `new`. Every executor edits an op's output this way.

    A write into `t` also moves the version counter of every argument sharing its memory
    under a counter of its own (`t.data = v` leaves `t` and `v` one memory, two counters),
    so whoever checks versions (capture's saved values, a sweep's prefix) sees it.
    """
    if new is t:
        return out
    if written:
        with torch._C.DisableTorchFunction():  # the write is the action's, not a model op
            t.copy_(new)
            for alias in _aliases(t, args):
                torch.autograd.graph.increment_version(alias)
        return out
    return substitute(out, t, new)


def _aliases(t: torch.Tensor, args: tuple) -> list[torch.Tensor]:
    """The tensor arguments other than `t` that share its memory."""
    try:
        memory = t.untyped_storage().data_ptr()
    except RuntimeError:  # a tensor without storage (sparse, meta)
        return []
    found = []
    for a in args:
        if isinstance(a, torch.Tensor) and a is not t:
            try:
                if a.untyped_storage().data_ptr() == memory:
                    found.append(a)
            except RuntimeError:
                continue
    return found


def run_action(act: Act, value: torch.Tensor, firing: Firing, overwritten: bool = False) -> tuple[torch.Tensor, FiringRecord]:
    """`act`'s action on `value`, checked, with the record of its firing (`value` as it was:
    a copy when `overwritten`, because the edit will be written into it). The action runs
    with torch functions disabled: its ops are not the model's.

    Raises:
        StopCapture: carrying an InterventionError naming the site, the action and the op
            when the action raised or returned something other than a tensor of `value`'s
            shape, dtype and device.
    """
    where = f"at op {firing.op_index} ({firing.func_name!r}"
    if firing.module_input:
        index, count = firing.module_input
        where += f", input {index} of {count} of {firing.module_call[0]}:{firing.module_call[1]}"
    elif firing.module_call:
        where += f", output {_output_text(firing)} of {firing.module_call[0]}:{firing.module_call[1]}"
    where += ")"
    if firing.label is not None:
        where += f", pass {firing.label!r}"
    with torch._C.DisableTorchFunction():
        try:
            new = act.action(value, firing)
        except Exception as exc:
            error = InterventionError(f"the action {act.action!r} of site {act.site!r} raised "
                                      f"{type(exc).__name__} {where}: {exc}")
            error.__cause__ = exc
            error.torchlog_op_index = firing.op_index
            raise StopCapture(error) from exc
        problem = unfit(new, value)
        if problem is not None:
            error = InterventionError(f"the action {act.action!r} of site {act.site!r} {problem} {where}; "
                                      "an action must return a tensor of the value's shape, dtype and device")
            error.torchlog_op_index = firing.op_index
            raise StopCapture(error)
        before = value.detach().clone() if overwritten else value.detach()
        return new, FiringRecord(act.number, firing, act.action, max_change(value, new), before)


def first_difference(expected: Sequence[str], ran: Sequence[str], start: int = 0,
                     stop: int | None = None) -> int | None:
    """The first position in [start, stop) where the op names `ran` differ from those a plan
    `expected` (a name missing on either side counts), or None: how every executor and the
    API check that a run made the ops its plan was built on.

    Example:
        >>> first_difference(["linear", "relu"], ["linear", "gelu"]), first_difference(["a"], ["a"])
        (1, None)
    """
    stop = max(len(expected), len(ran)) if stop is None else stop
    for k in range(start, stop):
        if k >= len(expected) or k >= len(ran) or expected[k] != ran[k]:
            return k
    return None


def _output_text(firing: Firing) -> str:
    """'0 of 3': which of a module call's returned tensors a firing acted on."""
    index, count = firing.module_output or (0, 1)
    return f"{index} of {count}"


def unreachable(site: Any, module_call: tuple[str, int], index: int, count: int, kind: str) -> str:
    """Why an action on a module's output cannot be delivered: the returned structure is a
    container torchlog cannot rebuild with the new tensor in it."""
    address, call = module_call
    return (f"site {site!r}: the action changed output {index} of {count} of {address}:{call}, but "
            f"{address!r} returns a {kind} torchlog cannot rebuild with the new tensor in it, so the "
            "change would never reach the model; name the op that made that tensor instead (its label, "
            "or a torchlog.select.func selector inside the module)")


def outputs_missing(site: Any, module_call: tuple[str, int], index: int, count: int, output: Any) -> str:
    """Why a module site cannot act on output `index`: the call returned fewer tensors
    than that (none at all, when they sit in a container torchlog does not look into)."""
    address, call = module_call
    if count == 0:
        return (f"site {site!r}: {address}:{call} returned a {type(output).__name__} with no tensor "
                "torchlog can find in it, so no change could reach the model; name the op that made "
                "the value instead (its label, or a torchlog.select.func selector inside the module)")
    return (f"site {site!r} names output {index} of {address}:{call}, which returned {count} "
            f"tensor(s); name output 0..{count - 1}")


def inputs_missing(site: Any, module_call: tuple[str, int], index: int, count: int) -> str:
    """Why a module-input site cannot act: the call received fewer tensors."""
    address, call = module_call
    return (f"site {site!r} names input {index} of {address}:{call}, which received {count} tensor(s)"
            + (f"; name input 0..{count - 1}" if count else "; a module that takes no tensor has no "
               "input to act on: name the op inside it instead"))
