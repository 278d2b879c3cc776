"""Copying what chosen modules return, with forward hooks, and noting every module call of a pass."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook

from torchlog.capture.nesting import find_tensors

__all__ = ["ModulePass", "run_module_outputs"]


@dataclass(slots=True)
class ModulePass:
    """What a pass with module hooks saw."""

    calls: list[int]  # id() of every submodule of the model called, in call order
    returned: dict[str, list[list[torch.Tensor]]]  # address -> per call, copies of its tensors
    output: Any  # what forward returned


def run_module_outputs(model: nn.Module, args: tuple, kwargs: dict, addresses: Sequence[str],
                       named_modules: list | None = None) -> ModulePass:
    """Run `model(*args, **kwargs)`, copying the tensors each call of the modules at
    `addresses` returns (parameters left out, in the order capture lists them).

    No TorchFunctionMode is entered: forward runs at full speed. One global pre-hook notes
    the calls of the model's modules (ignoring other models) and one forward hook per
    chosen module copies its outputs; all are removed when forward returns or raises.

    Raises:
        KeyError: an address that is not a submodule of `model`.
        Whatever forward raises, unchanged.

    Example:
        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
        >>> seen = run_module_outputs(net, (torch.ones(4, 2),), {}, ["1"])
        >>> len(seen.calls), seen.returned["1"][0][0].shape
        (3, torch.Size([4, 3]))
    """
    named = dict(model.named_modules() if named_modules is None else named_modules)
    ours = {id(m) for m in named.values()}
    params = {id(p) for p in model.parameters()}
    calls: list[int] = []
    returned: dict[str, list[list[torch.Tensor]]] = {address: [] for address in addresses}

    def note(module: nn.Module, _: Any) -> None:
        if id(module) in ours:
            calls.append(id(module))

    handles = [register_module_forward_pre_hook(note)]
    try:
        for address in addresses:
            handles.append(named[address].register_forward_hook(_copier(returned[address], params)))
        output = model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return ModulePass(calls, returned, output)


def _copier(calls: list, params: set[int]) -> Any:
    def copy(module: nn.Module, args: Any, output: Any) -> None:
        # Copied now: a later in-place op (ReLU(inplace=True)) must not change the saved value.
        calls.append([t.detach().clone() for t, _ in find_tensors(output) if id(t) not in params])

    return copy
