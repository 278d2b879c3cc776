"""A lean capture: counts the calls a full capture would record and copies only chosen outputs."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from torchlog.capture.nesting import find_tensors

# The recorder's own rules for which calls are ops: the lean count must match its call_id.
from torchlog.capture.ops import DESCRIPTIONS, collapse, describe, output_tensors

__all__ = ["LeanPass", "run_lean", "call_names"]

_Tensor = torch.Tensor


@dataclass(slots=True)
class LeanPass:
    """What a lean pass saw: the calls, in order, and copies of the outputs asked for."""

    calls: list[Any]  # the function of every counted call; a multi-output call adds its count after it
    saved: dict[tuple[int, int], torch.Tensor]  # (1-based call number, output index) -> copy
    output: Any  # what forward returned


class _LeanMode(TorchFunctionMode):
    """Counts tensor-producing calls like the Recorder's call_id; copies the wanted outputs.

    A Python functional runs as the recorder runs it (capture/functionals.py): its
    guard-free body with the mode pushed again, so that each op of the body counts; a body
    of one op (or none) counts as one call of the functional, which then runs unexpanded.
    """

    def __init__(self, wanted: Mapping[int, tuple[int, ...]]) -> None:
        super().__init__()
        self.wanted = wanted
        self.calls: list[Any] = []
        self.saved: dict[tuple[int, int], torch.Tensor] = {}
        self.expanding: set[Any] = set()  # functionals whose body runs now
        self.count = 0  # calls counted so far

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
        self._count(func, args, out)
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


def run_lean(model: nn.Module, args: tuple, kwargs: dict,
             wanted: Mapping[int, tuple[int, ...]]) -> LeanPass:
    """Run `model(*args, **kwargs)` counting ops and copying the outputs `wanted` names.

    Calls are numbered from 1 as the Recorder numbers them (`RawNode.call_id`): a torch
    function, method or operator counts when it is an op and returns a tensor, so the
    n-th call here is the n-th call of a full capture of the same pass.

    Args:
        model: the module to run.
        args, kwargs: forward's arguments.
        wanted: call number -> the output indexes of that call to copy.

    Returns:
        The LeanPass; the mode is removed when forward returns or raises.

    Raises:
        Whatever forward raises, unchanged.

    Example:
        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
        >>> seen = run_lean(net, (torch.ones(1, 2),), {}, {2: (0,)})
        >>> call_names(seen.calls), seen.saved[(2, 0)].shape
        (['linear', 'relu'], torch.Size([1, 3]))
    """
    with _LeanMode(wanted) as mode:
        output = model(*args, **kwargs)
    return LeanPass(mode.calls, mode.saved, output)


def call_names(calls: list[Any]) -> list[Any]:
    """`LeanPass.calls` with each function replaced by its op name (counts stay ints)."""
    return [c if isinstance(c, int) else describe(c).name for c in calls]
