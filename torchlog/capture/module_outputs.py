"""Copying what chosen modules return, with forward hooks, and noting every module call of a pass."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook

from torchlog.capture.nesting import find_tensors

__all__ = ["ModulePass", "run_module_outputs", "watching_modules"]

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
    with watching_modules(model, addresses, named_modules) as seen:
        seen.output = model(*args, **kwargs)
    return seen


class watching_modules:  # noqa: N801 - used like a function: `with watching_modules(...) as seen:`
    """While active, note every call of `model`'s modules and copy what the modules at
    `addresses` return, into the ModulePass it gives (its `output` left None), whoever
    runs the model: a plain call, or log_forward_pass logging it.

    Raises:
        KeyError: on entering, an address that is not a submodule of `model`.
    """

    __slots__ = ("seen", "_named", "_addresses", "_model", "_handles")

    def __init__(self, model: nn.Module, addresses: Sequence[str], named_modules: list | None = None) -> None:
        self._model = model
        self._named = named_modules
        self._addresses = addresses
        self.seen = ModulePass([], {address: [] for address in addresses}, None)
        self._handles: list = []

    def __enter__(self) -> ModulePass:
        named = dict(self._model.named_modules() if self._named is None else self._named)
        ours = {id(m) for m in named.values()}
        params = {id(p) for p in self._model.parameters()}
        calls = self.seen.calls

        def note(module: nn.Module, _: Any) -> None:
            if id(module) in ours:
                calls.append(id(module))

        self._handles = [register_module_forward_pre_hook(note)]
        try:
            for address in self._addresses:
                self._handles.append(named[address].register_forward_hook(
                    _copier(self.seen.returned[address], params)))
        except BaseException:
            self.__exit__()
            raise
        return self.seen

    def __exit__(self, *exc_info: object) -> bool:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        return False


def _copier(calls: list, params: set[int]) -> Any:
    def copy(module: nn.Module, args: Any, output: Any) -> None:
        # Copied now: a later in-place op (ReLU(inplace=True)) must not change the saved value.
        # Out of sight of a capture mode logging this pass: the copies are not the model's ops.
        with _DisableTorchFunction():
            calls.append([t.detach().clone() for t, _ in find_tensors(output) if id(t) not in params])

    return copy
