"""The two cheap ways to save a batch's selected layers in one model call: module forward hooks, and a lean pass.

Each runner is built from the first batch's logged pass and returns, for a batch, a
BatchValues: the values by label found as on the first batch, the values found by place
when the batch ran other calls, and a sequence that changes when the model runs other
calls (the modules called, or the ops called). The plan compares that sequence with the
first batch's to choose between the two.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from torchlog.capture import ModulePass, ModuleWatcher, Place, find_tensors, run_lean

__all__ = ["BatchValues", "HookRunner", "LeanRunner"]


@dataclass(slots=True)
class BatchValues:
    """What one call of the model gave the selected layers."""

    by_call: dict[str, torch.Tensor]  # label -> value, at the first batch's call positions
    by_place: dict[str, torch.Tensor]  # label -> value, at the first batch's places (see lean.py)
    sequence: list  # what the plan compares with the first batch's


class HookRunner:
    """Saves module outputs with forward hooks on the selected modules (no capture mode).

    Its sequence is the id of every module of the model called, in order, so a batch that
    calls other modules, or the same ones in another order, is noticed. A module's values
    do not depend on what runs around it: the k-th call of a chosen module gives the
    labels the first batch gave its k-th call, whatever else ran (a call it did not make
    leaves its labels missing, and extract refuses the batch).
    """

    def __init__(self, watcher: ModuleWatcher, outputs: Mapping[str, Sequence[Sequence[str]]],
                 order: Sequence[str]) -> None:
        """`watcher`: hooks on the modules of `outputs`, module address -> per call, the
        labels of the tensors it returned; `order`: every label, in execution order."""
        self._watcher = watcher
        self._outputs = outputs
        self._order = order

    def run(self, model: nn.Module, args: tuple, kwargs: dict) -> BatchValues:
        """Run forward once with the hooks."""
        with self._watcher as seen:
            model(*args, **kwargs)
        found = self.values(seen)
        return BatchValues(found, found, seen.calls)

    def values(self, seen: ModulePass) -> dict[str, torch.Tensor]:
        """The values by label, in execution order, from what the hooks copied."""
        found: dict[str, torch.Tensor] = {}
        for address, per_call in self._outputs.items():
            for labels, tensors in zip(per_call, seen.returned[address]):
                for label, tensor in zip(labels, tensors):
                    found.setdefault(label, tensor)
        return {label: found[label] for label in self._order if label in found}


class LeanRunner:
    """Saves op outputs under the lean capture, at the first batch's call positions and
    at its places at once (one copy when both name the same call).

    Inputs and outputs of the model are taken from forward's arguments and result, by
    their position among the tensors found there, as capture numbers them.
    """

    def __init__(self, positions: Mapping[str, tuple[int, int]], places: Mapping[str, tuple[Place, int]],
                 inputs: Mapping[str, int], outputs: Mapping[str, int], order: Sequence[str],
                 named_modules: list, stop_call: int | None = None) -> None:
        """`positions`: label -> (call number, output index); `places`: label -> (place,
        output index); `inputs`/`outputs`: label -> index among the model's distinct
        input tensors / returned tensors; `stop_call`: the call after which each pass
        ends (extract's stop_after), or None."""
        self._stop_call = stop_call
        self._positions = positions
        self._places = places
        self._inputs = inputs
        self._outputs = outputs
        self._order = order
        self._named = named_modules
        self._wanted: dict[int, tuple[int, ...]] = {}
        for call, index in positions.values():
            self._wanted[call] = self._wanted.get(call, ()) + (index,)
        self._wanted_places: dict[Place, tuple[int, ...]] = {}
        for place, index in places.values():
            self._wanted_places[place] = self._wanted_places.get(place, ()) + (index,)

    def run(self, model: nn.Module, args: tuple, kwargs: dict) -> BatchValues:
        """Run forward once under the lean capture; its sequence is LeanPass.calls."""
        given = list({id(t): t for t, _ in find_tensors((args, kwargs))}.values())
        ends = {label: given[i].detach().clone() for label, i in self._inputs.items() if i < len(given)}
        seen = run_lean(model, args, kwargs, self._wanted, self._wanted_places, self._named,
                        stop_call=self._stop_call)
        returned = [t for t, _ in find_tensors(seen.output)]
        ends.update({label: returned[i].detach() for label, i in self._outputs.items() if i < len(returned)})
        by_call, by_place = dict(ends), ends
        for label, position in self._positions.items():
            if position in seen.saved:
                by_call[label] = seen.saved[position]
        for label, place in self._places.items():
            if place in seen.at_places:
                by_place[label] = seen.at_places[place]
        return BatchValues(_ordered(by_call, self._order), _ordered(by_place, self._order), seen.calls)


def _ordered(found: dict[str, torch.Tensor], order: Sequence[str]) -> dict[str, torch.Tensor]:
    return {label: found[label] for label in order if label in found}
