"""The model's buffers as a step left them, carried to the next step (a step counter, a cache kept in buffers)."""
from __future__ import annotations

import torch
from torch import nn

from torchlog.model_state import put_buffers

__all__ = ["CarriedBuffers"]


class CarriedBuffers:
    """Every logged pass (and `torchlog.run`) puts the model's buffers back as they were,
    so that a pass leaves the model untouched. Between the steps of a generation that would
    undo what a model keeps in buffers from one call to the next, and it would generate other
    tokens than without torchlog. So each run of a step notes the buffers it changed
    (reassigned, or written: their version counters moved; every buffer of a module in
    training mode, whose batch norm updates its stats without moving them), and once the
    step is over they are put back as the step's last run left them.

    Args:
        model: the generating model.
    """

    def __init__(self, model: nn.Module) -> None:
        self.modules = [module for module in model.modules() if module._buffers]
        self._marks: list[tuple[nn.Module, dict]] = []
        self._left: list[tuple[nn.Module, dict, dict[str, torch.Tensor]]] = []

    def start(self) -> None:
        """Note the buffers as the step is given them."""
        self._marks = [(module, {name: (b, b.data_ptr(), b._version) for name, b in module._buffers.items()
                                 if b is not None}) for module in self.modules]
        self._left = []

    def ran(self) -> None:
        """After a run of the step (before its pass puts the buffers back): keep what it changed."""
        left = []
        for module, marks in self._marks:
            current = dict(module._buffers)
            changed = {name: b.detach().clone() for name, b in current.items()
                       if b is not None and not b.is_meta and (module.training or _moved(b, marks.get(name)))}
            if changed or any(current.get(name) is not mark[0] for name, mark in marks.items()) \
                    or current.keys() != marks.keys():
                left.append((module, current, changed))
        self._left = left

    def put_back(self) -> None:
        """Put the buffers the step's last run changed as it left them."""
        with torch.no_grad(), torch._C.DisableTorchFunction():
            for module, current, changed in self._left:
                put_buffers(module, current)
                for name, value in changed.items():
                    buffer = current[name]
                    if buffer.shape != value.shape or buffer.dtype != value.dtype:
                        buffer.data = value
                    else:
                        buffer.data.copy_(value)
        self._left = []


def _moved(buffer: torch.Tensor, mark: tuple | None) -> bool:
    """Whether a buffer is another tensor, or memory written, since the step began."""
    return mark is None or mark[0] is not buffer or mark[1] != buffer.data_ptr() or mark[2] != buffer._version
