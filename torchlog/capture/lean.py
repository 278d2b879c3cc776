"""A lean capture: counts the calls a full capture would record and copies only chosen outputs.

Outputs are chosen two ways at once: by call number (the n-th call of the pass, as the
recorder numbers them) and by place (the n-th call of a function inside a module, counted
over the pass). Extract uses the first when a batch runs the ops its first batch ran, and
the second when it does not: then call numbers have moved, but the op the user chose is
still the n-th `linear` inside `fc2`, and its value comes from this same call.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode

from torchlog.capture.nesting import find_tensors

# The recorder's own rules for which calls are ops: the lean count must match its call_id.
from torchlog.capture.ops import DESCRIPTIONS, collapse, describe, output_tensors
from torchlog.capture.plan import Firing, OpPlan, StopCapture, substitute, unfit
from torchlog.errors import InterventionError

__all__ = ["LeanPass", "Place", "run_lean", "call_names"]

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
    stopped: bool = False  # the pass ended after call `stop_call` (forward did not return)


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
        self.stop_call = stop_call  # the call after which the pass ends, or None
        self.wanted = wanted
        self.places = places
        self.place_names = frozenset(name for name, _, _ in places)
        self.calls: list[Any] = []
        self.saved: dict[tuple[int, int], torch.Tensor] = {}
        self.at_places: dict[tuple[Place, int], torch.Tensor] = {}
        self.expanding: set[Any] = set()  # functionals whose body runs now
        self.count = 0  # calls counted so far
        self.acts = plan.at_calls if plan is not None else {}  # (call, output) -> actions
        self.modules: list[str] = [""]  # addresses of the modules running now, innermost last
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
        if self.acts:
            out = self._act(func, args, out)
        self._count(func, args, out)
        return out

    def _act(self, func: Any, args: tuple, out: Any) -> Any:
        """Apply the plan's actions to the outputs of the call that just returned (the
        next call number), as the recorder does; return what the model gets."""
        outs = output_tensors(func, args, out)
        call = self.count + 1
        for output_index, (t, _) in enumerate(outs):
            planned = self.acts.get((call, output_index))
            if planned is None:
                continue
            index, label, acts = planned
            new = t
            for act in acts:
                new = act.action(new, Firing(act.site, index, describe(func).name, None, label))
                problem = unfit(new, t)
                if problem is not None:
                    raise InterventionError(
                        f"the action {act.action!r} of site {act.site!r} {problem} at {label!r}; an "
                        "action must return a tensor of the value's shape, dtype and device")
            if any(t is a for a in args):  # an in-place op: the edit goes where it wrote
                t.copy_(new)
            else:
                out = substitute(out, t, new)
        return out

    def _count(self, func: Any, args: tuple, out: Any) -> None:
        outs = [t for t, _ in output_tensors(func, args, out)]
        if not outs:
            return
        self.calls.append(func)
        if len(outs) != 1:
            self.calls.append(len(outs))
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
             stop_call: int | None = None) -> LeanPass:
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
    mode = _LeanMode(wanted, places or {}, plan, stop_call)
    handles = _follow_modules(model, mode, named_modules) if places else ()
    output, stopped = None, False
    try:
        with mode:
            output = model(*args, **kwargs)
    except StopCapture as stop:
        if stop.error is not None:
            raise stop.error from None
        stopped = True
    finally:
        for handle in handles:
            handle.remove()
    return LeanPass(mode.calls, mode.saved, output, mode.at_places, stopped)


def _follow_modules(model: nn.Module, mode: _LeanMode, named_modules: list | None) -> tuple:
    """Global module hooks keeping `mode.modules` the stack of this model's modules running."""
    addresses: dict[int, str] = {}
    for address, module in model.named_modules() if named_modules is None else named_modules:
        addresses.setdefault(id(module), address)
    stack = mode.modules

    def enter(module: nn.Module, _: Any) -> None:
        address = addresses.get(id(module))
        if address is not None:
            stack.append(address)

    def leave(module: nn.Module, _: Any, __: Any) -> None:
        if id(module) in addresses and len(stack) > 1:
            stack.pop()

    return (register_module_forward_pre_hook(enter),
            register_module_forward_hook(leave, always_call=True))


def call_names(calls: list[Any]) -> list[Any]:
    """`LeanPass.calls` with each function replaced by its op name (counts stay ints)."""
    return [c if isinstance(c, int) else describe(c).name for c in calls]
