"""The two cheap ways to save a batch's selected layers: module forward hooks, and a lean pass.

Each runner is built from the labels a full logged pass gave the first batch and returns,
for a batch, the values by label plus a sequence that changes when the model runs other
calls: the modules called (hooks) or the ops called (lean pass). The plan compares that
sequence with the first batch's and falls back to the full path when they differ.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from torchlog.capture.lean import run_lean
from torchlog.capture.module_outputs import run_module_outputs
from torchlog.capture.nesting import find_tensors

__all__ = ["HookRunner", "LeanRunner"]


class HookRunner:
    """Saves module outputs with forward hooks on the selected modules (no capture mode).

    Its sequence is the id of every module of the model called, in order, so a batch that
    calls other modules, or the same ones in another order, is noticed; ops inside a
    module do not change what the module returns.
    """

    def __init__(self, model: nn.Module, outputs: Mapping[str, Sequence[Sequence[str]]],
                 order: Sequence[str]) -> None:
        """`outputs`: module address -> per call, the labels of the tensors it returned;
        `order`: every label, in execution order."""
        self._named = list(model.named_modules())
        self._outputs = outputs
        self._order = order

    def run(self, model: nn.Module, args: tuple, kwargs: dict) -> tuple[dict[str, torch.Tensor] | None, list]:
        """Run forward once; return (values by label in execution order, or None when a
        selected module was called another number of times or returned another number of
        tensors than on the first batch; the module call sequence)."""
        seen = run_module_outputs(model, args, kwargs, list(self._outputs), self._named)
        found: dict[str, torch.Tensor] = {}
        for address, per_call in self._outputs.items():
            calls = seen.returned[address]
            if len(calls) != len(per_call) or any(len(a) != len(b) for a, b in zip(calls, per_call)):
                return None, seen.calls
            for labels, tensors in zip(per_call, calls):
                for label, tensor in zip(labels, tensors):
                    found.setdefault(label, tensor)
        return {label: found[label] for label in self._order}, seen.calls


class LeanRunner:
    """Saves op outputs at the call positions of the first batch, under the lean capture.

    Inputs and outputs of the model are taken from forward's arguments and result, by
    their position among the tensors found there, as capture numbers them.
    """

    def __init__(self, positions: Mapping[str, tuple[int, int]], inputs: Mapping[str, int],
                 outputs: Mapping[str, int], order: Sequence[str]) -> None:
        """`positions`: label -> (call number, output index); `inputs`/`outputs`: label ->
        index among the model's distinct input tensors / returned tensors."""
        self._positions = positions
        self._inputs = inputs
        self._outputs = outputs
        self._order = order
        self._wanted: dict[int, tuple[int, ...]] = {}
        for call, index in positions.values():
            self._wanted[call] = self._wanted.get(call, ()) + (index,)

    def run(self, model: nn.Module, args: tuple, kwargs: dict) -> tuple[dict[str, torch.Tensor] | None, list]:
        """Run forward once; return (values by label, or None when a position was not
        reached; the calls of the pass, see LeanPass.calls)."""
        given = list({id(t): t for t, _ in find_tensors((args, kwargs))}.values())
        found = {label: given[i].detach().clone() for label, i in self._inputs.items() if i < len(given)}
        seen = run_lean(model, args, kwargs, self._wanted)
        returned = [t for t, _ in find_tensors(seen.output)]
        found.update({label: returned[i].detach() for label, i in self._outputs.items()
                      if i < len(returned)})
        for label, position in self._positions.items():
            if position in seen.saved:
                found[label] = seen.saved[position]
        if len(found) != len(self._order):
            return None, seen.calls
        return {label: found[label] for label in self._order}, seen.calls
