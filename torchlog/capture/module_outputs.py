"""Copying what chosen modules return, with forward hooks, and noting every module call of a pass."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook

from torchlog.capture.nesting import find_tensors

__all__ = ["ModulePass", "ModuleWatcher", "run_module_outputs"]

_DisableTorchFunction = torch._C.DisableTorchFunction


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
    To run many passes, make one ModuleWatcher and enter it around each.

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
    with ModuleWatcher(model, addresses, named_modules) as seen:
        seen.output = model(*args, **kwargs)
    return seen


class ModuleWatcher:
    """Hooks that note every call of a model's modules and copy what the modules at
    `addresses` return, whoever runs the model (a plain call, or log_forward_pass logging
    it). Made once; each `with watcher as seen:` fills a new ModulePass (its `output` left
    None) and removes the hooks on leaving.

    The model's modules and parameters are read when it is made: a pass costs only the
    hooks (bench/extract_bench.py runs one per batch).

    Raises:
        KeyError: when made, an address that is not a submodule of `model`.

    Example:
        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
        >>> watcher = ModuleWatcher(net, ["0"])
        >>> with watcher as seen:
        ...     _ = net(torch.ones(1, 2))
        >>> len(seen.calls), len(seen.returned["0"])
        (3, 1)
    """

    __slots__ = ("_ours", "_params", "_targets", "_handles", "_seen")

    def __init__(self, model: nn.Module, addresses: Sequence[str], named_modules: list | None = None) -> None:
        named = dict(model.named_modules() if named_modules is None else named_modules)
        self._ours = frozenset(id(m) for m in named.values())
        self._params = frozenset(id(p) for p in model.parameters())
        self._targets = [(address, named[address]) for address in addresses]
        self._handles: list = []
        self._seen: ModulePass | None = None

    def __enter__(self) -> ModulePass:
        seen = self._seen = ModulePass([], {address: [] for address, _ in self._targets}, None)
        ours, calls = self._ours, seen.calls

        def note(module: nn.Module, _: Any) -> None:
            if id(module) in ours:
                calls.append(id(module))

        self._handles = [register_module_forward_pre_hook(note)]
        for address, module in self._targets:
            self._handles.append(module.register_forward_hook(_copier(seen.returned[address], self._params)))
        return seen

    def __exit__(self, *exc_info: object) -> bool:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        return False


def _copier(calls: list, params: frozenset[int]) -> Any:
    def copy(module: nn.Module, args: Any, output: Any) -> None:
        # Copied now: a later in-place op (ReLU(inplace=True)) must not change the saved value.
        # Out of sight of a capture mode logging this pass: the copies are not the model's ops.
        with _DisableTorchFunction():
            calls.append([t.detach().clone() for t, _ in find_tensors(output) if id(t) not in params])

    return copy
