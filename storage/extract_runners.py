"""The two cheap ways to save a batch's selected layers: module forward hooks, and a lean pass.

Each runner is built from the labels a full logged pass gave the first batch and returns,
for a batch, the values by label plus a sequence that changes when the model runs other
calls: the modules called (hooks) or the ops called (lean pass). The plan compares that
sequence with the first batch's and falls back to the full path when they differ.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook

from torchlog.capture.lean import run_lean
from torchlog.capture.nesting import find_tensors

__all__ = ["HookRunner", "LeanRunner", "returned_tensors"]


def returned_tensors(output: Any, param_ids: set[int]) -> list[torch.Tensor]:
    """The tensors a module call returned, as capture lists them (parameters left out)."""
    return [t for t, _ in find_tensors(output) if id(t) not in param_ids]


class HookRunner:
    """Saves module outputs with forward hooks on the selected modules.

    Its sequence is the id of every module of the model called, in order (a global
    pre-hook), so a batch that calls other modules, or the same ones in another order,
    is noticed; ops inside a module do not change what the module returns.
    """

    def __init__(self, model: nn.Module, outputs: Mapping[str, Sequence[Sequence[str]]],
                 order: Sequence[str]) -> None:
        """`outputs`: module address -> per call, the labels of the tensors it returned;
        `order`: every label, in execution order."""
        self._modules = dict(model.named_modules())
        self._ids = {id(m) for m in self._modules.values()}
        self._param_ids = {id(p) for p in model.parameters()}
        self._outputs = outputs
        self._order = order

    def run(self, model: nn.Module, args: tuple, kwargs: dict) -> tuple[dict[str, torch.Tensor] | None, list]:
        """Run forward once; return (values by label in execution order, or None when a
        selected module was called another number of times or returned another number of
        tensors than on the first batch; the module call sequence)."""
        found: dict[str, torch.Tensor] = {}
        calls: list[int] = []
        missing: list[bool] = []
        handles = [register_module_forward_pre_hook(
            lambda module, _: calls.append(id(module)) if id(module) in self._ids else None)]
        try:
            for address, per_call in self._outputs.items():
                hook = self._hook(per_call, found, missing)
                handles.append(self._modules[address].register_forward_hook(hook))
            model(*args, **kwargs)
        finally:
            for handle in handles:
                handle.remove()
        done = not missing and len(found) == len(self._order)
        return ({label: found[label] for label in self._order} if done else None), calls

    def _hook(self, per_call: Sequence[Sequence[str]], found: dict, missing: list) -> Any:
        count = [0]

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            count[0] += 1
            tensors = returned_tensors(output, self._param_ids)
            if count[0] > len(per_call) or len(tensors) != len(per_call[count[0] - 1]):
                missing.append(True)
                return
            for label, tensor in zip(per_call[count[0] - 1], tensors):
                if label not in found:  # nested modules may return one tensor: copy it once
                    found[label] = tensor.detach().clone()

        return hook


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
