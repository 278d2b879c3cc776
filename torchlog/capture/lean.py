"""A lean capture: counts the calls a full capture would record and copies only chosen outputs.

Outputs are chosen two ways at once: by call number (the n-th call of the pass, as the
recorder numbers them) and by place (the n-th call of a function inside a module, counted
over the pass). Extract uses the first when a batch runs the ops its first batch ran, and
the second when it does not: then call numbers have moved, but the op the user chose is
still the n-th `linear` inside `fc2`, and its value comes from this same call.
"""
from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode


# The recorder's own rules for which calls are ops: the lean count must match its call_id.
from torchlog.capture.ops import DESCRIPTIONS, UNDEFINED_VALUES, collapse, describe, output_tensors
from torchlog.capture.module_acts import ExitActs, exit_refusal
from torchlog.capture.offload import offload_hooks
from torchlog.capture.plan import (Firing, FiringRecord, OpPlan, OpView, StopCapture, deliver, first_difference,
                                   is_written, run_action)
from torchlog.errors import InterventionError
from torchlog.labels import layer_type_of

__all__ = ["HookedSpan", "LeanPass", "Place", "call_names", "hooks_only", "lean_refusal", "run_lean"]

_Tensor = torch.Tensor


# Where a call ran, as a program point: (op name, innermost module address or '' for the
# model's own forward, 1-based count of such calls so far in the pass).
Place = tuple[str, str, int]


@dataclass(slots=True)
class LeanPass:
    """What a lean pass saw: the calls, in order, and copies of the outputs asked for."""

    calls: list[Any]  # the function of every counted call; a multi-output call adds its count after it
    saved: dict[tuple[int, int], torch.Tensor]  # (1-based call number, output index) -> copy
    output: Any  # what forward returned; None when the pass was stopped
    at_places: dict[tuple[Place, int], torch.Tensor] = field(default_factory=dict)  # (place, output index) -> copy
    stopped: bool = False  # the pass ended at the plan's stop (forward did not return)
    firings: list[FiringRecord] = field(default_factory=list)  # the plan's actions applied, in order


class _LeanMode(TorchFunctionMode):
    """Counts tensor-producing calls like the Recorder's call_id; copies the wanted outputs.

    A Python functional runs as the recorder runs it (capture/functionals.py): its
    guard-free body with the mode pushed again, so that each op of the body counts; a body
    of one op (or none) counts as one call of the functional, which then runs unexpanded.
    """

    def __init__(self, wanted: Mapping[int, tuple[int, ...]],
                 places: Mapping[Place, tuple[int, ...]], plan: OpPlan | None = None,
                 stop_call: int | None = None) -> None:
        super().__init__()
        plan = plan if plan is not None else OpPlan()
        self.plan = plan
        self.stop_call = stop_call if stop_call is not None else plan.stop_call  # end after this call
        self.wanted = wanted
        self.places = places
        self.place_names = frozenset(name for name, _, _ in places)
        self.calls: list[Any] = []
        self.names: list[str] = []  # op name of every counted call, for the plan's check
        self.saved: dict[tuple[int, int], torch.Tensor] = {}
        self.at_places: dict[tuple[Place, int], torch.Tensor] = {}
        self.expanding: set[Any] = set()  # functionals whose body runs now
        self.count = 0  # calls counted so far
        self.acting = bool(plan.at_calls or plan.at_ops)
        self.checked = 0  # calls found equal to the plan's logged pass so far
        self.firings: list[FiringRecord] = []
        self.acted: dict[int, tuple[int, Any]] = {}  # id(value an op action made) -> (number, site)
        self.modules: list[str] = [""]  # addresses of the modules running now, innermost last
        self.path: tuple[tuple[str, int], ...] = ()  # (address, call) of the modules running now
        self.num_at: dict[tuple[str, str], int] = {}  # (name, module) -> calls so far

    def __torch_function__(self, func, types, args=(), kwargs=None):
        entry = DESCRIPTIONS.get(func)
        if entry is None:
            entry = describe(func)
        kwargs = kwargs or {}
        if entry.not_op:
            return func(*args, **kwargs)
        if entry.body is not None and func not in self.expanding:
            return self._expand(func, entry.body, args, kwargs)
        out = func(*args, **kwargs)
        if self.acting:
            out = self._act(func, entry.name, entry.writes_first_arg, args, kwargs, out)
        self._count(func, args, out)
        return out

    def _act(self, func: Any, name: str, writes: bool, args: tuple, kwargs: dict, out: Any) -> Any:
        """Apply the plan's actions to the outputs of the call that just returned (the
        next call number), as the recorder does; return what the model gets."""
        plan, call = self.plan, self.count + 1
        for output_index, (t, _) in enumerate(output_tensors(func, args, out)):
            planned = plan.at_calls.get((call, output_index)) if plan.at_calls else None
            index, label, acts = planned if planned is not None else (-1, None, ())
            if planned is not None:
                self._check(call, name, label)
            if plan.at_ops:
                view = OpView(name, layer_type_of(name), self.path, tuple(t.shape), t.dtype, -1, output_index)
                found = tuple(rule.act for rule in plan.at_ops if rule.test(view))
                acts = tuple(sorted(acts + found, key=lambda a: a.number))
            if not acts:
                continue
            written = is_written(t, args, kwargs, writes)
            new = t
            for act in acts:
                new, record = run_action(act, new, Firing(act.site, index, name, None, label),
                                         written and new is t)
                self.firings.append(record)
            out = deliver(out, t, new, written, args)
            self.acted[id(t if written else new)] = (acts[-1].number, acts[-1].site)
        return out

    def _check(self, call: int, name: str, label: str | None) -> None:
        """Refuse to act at call `call` unless this pass ran the logged pass's calls up to it."""
        expected = self.plan.expected_calls
        if not expected:
            return
        ran = self.names[self.checked:] + [name]
        k = first_difference(expected[self.checked:call], ran)
        if k is not None:
            position = self.checked + k
            then = repr(expected[position]) if position < len(expected) else "nothing"
            error = InterventionError(
                f"this pass ran other ops than the logged pass its sites were found in: call "
                f"{position + 1} is {ran[k]!r} where that pass had {then} (before {label!r}), so no "
                "action was applied to a possibly wrong op; use a module address or a torchlog.select "
                "selector, which are found while the pass runs")
            error.torchlog_ops_changed = True
            raise StopCapture(error)
        self.checked = call

    def _count(self, func: Any, args: tuple, out: Any) -> None:
        outs = [t for t, _ in output_tensors(func, args, out)]
        if not outs:
            return
        self.calls.append(func)
        if len(outs) != 1:
            self.calls.append(len(outs))
        if self.acting:
            self.names.append(describe(func).name)
        self.count += 1
        wanted = self.wanted.get(self.count)
        if wanted is not None:
            for index in wanted:
                if index < len(outs):  # a call with fewer outputs now: the caller's check sees it
                    self.saved[(self.count, index)] = outs[index].detach().clone()
        if self.place_names:
            self._count_place(func, outs, wanted)
        if self.count == self.stop_call:
            raise StopCapture()
        stop_on = self.plan.stop_on
        if stop_on is not None and describe(func).name not in UNDEFINED_VALUES:
            with torch._C.DisableTorchFunction():  # the test's own ops are not the model's
                if any(stop_on(t) for t in outs):
                    raise StopCapture()

    def _count_place(self, func: Any, outs: list, wanted: tuple[int, ...] | None) -> None:
        """Number this call among the calls of its function in its module; copy it when its
        place is chosen (sharing the copy its call number made)."""
        name = describe(func).name
        if name not in self.place_names:
            return
        scope = (name, self.modules[-1])
        number = self.num_at[scope] = self.num_at.get(scope, 0) + 1
        chosen = self.places.get((*scope, number))
        for index in chosen or ():
            if index < len(outs):
                copy = self.saved.get((self.count, index)) if wanted and index in wanted else None
                self.at_places[((*scope, number), index)] = (
                    outs[index].detach().clone() if copy is None else copy)

    def _expand(self, func: Any, body: Any, args: tuple, kwargs: dict) -> Any:
        first_call, first_entry = self.count, len(self.calls)
        self.expanding.add(func)
        try:
            with self:  # the body's torch calls reach the mode again
                out = body(*args, **kwargs)
        finally:
            self.expanding.discard(func)
        if self.count - first_call >= 2:
            return out
        collapse(func)  # one op: the functional runs as that op from now on, as in the recorder
        if self.count == first_call:
            self._count(func, args, out)
        else:
            self.calls[first_entry] = func  # the recorder names the op after the functional
        return out


def run_lean(model: nn.Module, args: tuple, kwargs: dict, wanted: Mapping[int, tuple[int, ...]],
             places: Mapping[Place, tuple[int, ...]] | None = None,
             named_modules: list | None = None, plan: OpPlan | None = None,
             stop_call: int | None = None, count: bool = True) -> LeanPass:
    """Run `model(*args, **kwargs)` counting ops and copying the outputs `wanted` and
    `places` name.

    Calls are numbered from 1 as the Recorder numbers them (`RawNode.call_id`): a torch
    function, method or operator counts when it is an op and returns a tensor, so the
    n-th call here is the n-th call of a full capture of the same pass. A call's place is
    its op name, the module running it (innermost, by its first address in
    `named_modules`, as capture's `containing_modules` names it) and how many calls of
    that name ran in that module before, plus one; module calls are followed with global
    module hooks only when `places` is given.

    Args:
        model: the module to run.
        args, kwargs: forward's arguments.
        wanted: call number -> the output indexes of that call to copy.
        places: place -> the output indexes of the call there to copy.
        named_modules: `list(model.named_modules())` when the caller has it.
        plan: actions by call position (`OpPlan.at_calls`; capture/plan.py), applied to
            the outputs of those calls as the recorder applies them.
        stop_call: end the pass right after this call was counted (and its outputs
            copied), as `stop_after` ends a logged pass: nothing after it runs.
        count: count the calls (`LeanPass.calls`). Without it, a plan that only acts or
            stops at module exits runs with module hooks alone, no mode: a plain forward
            and one hook per module acted on.

    Returns:
        The LeanPass (`stopped` when `stop_call` was reached); the mode is removed when
        forward returns, raises or is stopped.

    Raises:
        Whatever forward raises, unchanged.

    Example:
        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
        >>> seen = run_lean(net, (torch.ones(1, 2),), {}, {2: (0,)})
        >>> call_names(seen.calls), seen.saved[(2, 0)].shape
        (['linear', 'relu'], torch.Size([1, 3]))
    """
    refused = lean_refusal(plan) if plan is not None else None
    if refused is not None:
        raise InterventionError(f"the lean capture cannot honour this plan: {refused}")
    if not count and not wanted and not places and stop_call is None and plan is not None and _exits_only(plan):
        return _hooks_only(model, args, kwargs, plan, named_modules)
    mode = _LeanMode(wanted, places or {}, plan, stop_call)
    follow = bool(places) or (plan is not None and bool(plan.at_ops))
    handles = _follow_modules(model, mode, named_modules) if follow else ()
    exits = None
    if plan is not None and (plan.at_exits or plan.at_entries or plan.stop_exit):
        exits = ExitActs(plan, dict(model.named_modules() if named_modules is None else named_modules))
    output, stopped = None, False
    try:
        with offload_hooks(model, named_modules), mode, (exits if exits is not None else contextlib.nullcontext()):
            if exits is not None:  # one order of firings, one table of values acted on
                exits.firings, exits.acted = mode.firings, mode.acted
            output = model(*args, **kwargs)
    except StopCapture as stop:
        if stop.error is not None:
            raise stop.error from None
        stopped = True
    finally:
        for handle in handles:
            handle.remove()
    return LeanPass(mode.calls, mode.saved, output, mode.at_places, stopped, mode.firings)


def _exits_only(plan: OpPlan) -> bool:
    """Whether the plan acts and stops only at module exits (no op-level field)."""
    return not (plan.at_calls or plan.at_ops or plan.stop_on is not None or plan.stop_call is not None)


def _hooks_only(model: nn.Module, args: tuple, kwargs: dict, plan: OpPlan, named_modules: list | None) -> LeanPass:
    """The pass with the plan's module hooks and no mode (nothing to count)."""
    with HookedSpan(model, plan, named_modules) as span:
        return span.run(args, kwargs)


class HookedSpan:
    """A plan that acts and stops only at module exits and entries (`hooks_only`), its hooks
    (and the stand-ins of accelerate's) kept in place while the span is entered, for one
    pass or for many passes of one model: each `run` is the pass of `run_lean(count=False)`
    without registering them again (the steps of a generation).

    Raises:
        InterventionError: when made, the plan names a module the model does not have.
    """

    def __init__(self, model: nn.Module, plan: OpPlan, named_modules: list | None = None) -> None:
        named_modules = list(model.named_modules()) if named_modules is None else named_modules
        self.model = model
        self.exits = ExitActs(plan, dict(named_modules))
        self._offload = offload_hooks(model, named_modules)

    def __enter__(self) -> HookedSpan:
        self._offload.__enter__()
        try:
            self.exits.__enter__()
        except BaseException:
            self._offload.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc_info: object) -> bool:
        try:
            self.exits.__exit__(*exc_info)
        finally:  # a raising forward puts offloaded weights back
            self._offload.__exit__(*exc_info)
        return False

    def run(self, args: tuple, kwargs: dict) -> LeanPass:
        """One pass of the model under the span's hooks."""
        self.exits.reset()
        try:
            return LeanPass([], {}, self.model(*args, **kwargs), {}, False, self.exits.firings)
        except StopCapture as stop:
            if stop.error is not None:
                raise stop.error from None
            return LeanPass([], {}, None, {}, True, self.exits.firings)


def hooks_only(plan: OpPlan) -> bool:
    """Whether `plan` can run with module hooks alone: no op-level field (see `_exits_only`)
    and nothing the lean capture refuses."""
    return _exits_only(plan) and lean_refusal(plan) is None


def lean_refusal(plan: OpPlan) -> str | None:
    """Why the lean capture cannot honour `plan` (the field and the site), or None: it numbers
    calls, not passes, so it cannot test a pass's position nor guess a label's node, and it
    saves by call position only (`wanted`, `places`), not by the plan's saving fields."""
    for rule in plan.at_ops:
        if rule.uses_position:
            return (f"at_ops: site {rule.act.site!r} may read the op's position (a `where` predicate), "
                    "which only the full capture numbers; log the pass instead")
    if plan.at_nodes:
        return "at_nodes: label sites guessed by node index need the full capture; resolve them to calls first"
    if plan.save_exits or plan.save_ops:
        return "save_exits/save_ops: the lean capture saves by call position; pass `wanted` instead"
    if plan.stop_node is not None and plan.stop_call is None:
        return f"stop_node: node {plan.stop_node} has no call number (stop_call) in the plan"
    return exit_refusal(plan)


def _follow_modules(model: nn.Module, mode: _LeanMode, named_modules: list | None) -> tuple:
    """Global module hooks keeping `mode.modules` the stack of this model's modules running
    (and `mode.path` their (address, call number) pairs, numbered as the recorder does)."""
    addresses: dict[int, str] = {}
    for address, module in model.named_modules() if named_modules is None else named_modules:
        addresses.setdefault(id(module), address)
    stack = mode.modules
    calls: dict[str, int] = {}

    def enter(module: nn.Module, _: Any) -> None:
        address = addresses.get(id(module))
        if address:
            stack.append(address)
            calls[address] = calls.get(address, 0) + 1
            mode.path = mode.path + ((address, calls[address]),)

    def leave(module: nn.Module, _: Any, __: Any) -> None:
        if addresses.get(id(module)) and len(stack) > 1:
            stack.pop()
            mode.path = mode.path[:-1]

    return (register_module_forward_pre_hook(enter),
            register_module_forward_hook(leave, always_call=True))


def call_names(calls: list[Any]) -> list[Any]:
    """`LeanPass.calls` with each function replaced by its op name (counts stay ints)."""
    return [c if isinstance(c, int) else describe(c).name for c in calls]
