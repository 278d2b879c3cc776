"""Gradients of a loss with respect to every logged tensor, caught by hooks during backward.

The history is built after the forward pass, but gradients only exist once the user calls
`backward()` later. So capture registers one tensor hook per node that requires grad, and
each hook writes into a `GradientStore`; once the history exists, the store is attached to
its pass records (looked up by `op_index`, which is the node index), and from then on every
hook writes straight into `PassRecord.grad_contents`, or hands the gradient to a sink that
stores it elsewhere (torchlog.storage writes it to the log file) and keeps what the sink
returns. A hook that fires before the store is attached (backward called inside forward)
is kept in memory and applied on attach.
"""
from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError, TorchlogWarning
from torchlog.records import LazyTensor, PassRecord

__all__ = ["GradientStore", "warn_if_no_gradients", "check_gradient_options", "log_backward"]

class GradientStore:
    """Receives the gradient of each hooked node and files it in that node's PassRecord.

    One store serves one forward pass. Hooks keep a reference to the store, so the
    autograd graph keeps it alive until the graph is freed; the store names the records it
    fills weakly (a hooked tensor is also a record's saved value: a strong name would tie
    the two in a cycle only the cyclic collector frees), so a history freed before
    backward runs leaves nothing to fill.
    `sink`, when given, is called with (op_index, gradient) as each gradient arrives and
    returns what the record keeps instead (a LazyTensor), like CaptureOptions.sink for
    activations; what it raises leaves `backward()` unchanged.
    """

    def __init__(self, output_device: torch.device | None = None,
                 sink: Callable[[int, torch.Tensor], Any] | None = None) -> None:
        self.output_device = output_device
        self.sink = sink
        self.num_hooked = 0  # nodes whose tensor required grad and got a hook
        self._records: dict[int, weakref.ref] | None = None  # op_index -> its PassRecord
        self._early: dict[int, torch.Tensor] = {}  # gradients that arrived before attach
        self._handles: dict[int, Any] = {}  # node index -> its hook (replaced with its tensor)

    def on_node(self, node: Any, tensor: torch.Tensor) -> None:
        """Capture callback (`CaptureOptions.on_node`): hook `tensor` if it can have a gradient.

        A hook registered before an in-place op sees the gradient with respect to the
        value before that op, so every pass of a mutated tensor gets its own gradient.
        """
        if not tensor.requires_grad:
            return
        index = node.index
        handle = tensor.register_hook(lambda grad: self._receive(index, grad))
        previous = self._handles.get(index)
        if previous is not None:  # an intervention replaced the node's tensor: its gradient is the new one's
            previous.remove()
        else:
            self.num_hooked += 1
        self._handles[index] = handle

    def _receive(self, index: int, grad: torch.Tensor) -> None:
        if self._records is None:
            self._early[index] = self._copy(grad)
            return
        ref = self._records.get(index)
        if ref is None:  # pruned passes (layers_to_save) keep no gradient
            return
        record = ref()  # None once the history is freed: a sink still gets the gradient
        if self.sink is not None:
            # A sink has stored the gradient when it returns, so it needs no copy of its own.
            kept = self.sink(index, grad.detach())
            if record is not None:
                record.grad_saved = kept
        elif record is not None:
            record.grad_saved = self._copy(grad)

    def _copy(self, grad: torch.Tensor) -> torch.Tensor:
        """A private copy (autograd may reuse the buffer it passed to the hook), on output_device."""
        kept = grad.detach()
        if self.output_device is not None and kept.device != self.output_device:
            return kept.to(self.output_device)
        return kept.clone()

    def attach(self, records: Iterable[PassRecord]) -> None:
        """Route gradients to `records` (matched by op_index), including any that came early."""
        records = {record.op_index: record for record in records}
        self._records = {index: weakref.ref(record) for index, record in records.items()}
        for index, grad in self._early.items():
            record = records.get(index)
            if record is not None:
                record.grad_saved = grad
        self._early.clear()


def warn_if_no_gradients(num_hooked: int, grad_was_enabled: bool) -> None:
    """Warn when no logged tensor required grad (`num_hooked` is 0), saying why.

    `stacklevel` points at the caller of log_forward_pass.
    """
    if num_hooked:
        return
    if not grad_was_enabled:
        why = ("gradient tracking was off (torch.no_grad() or torch.inference_mode() was "
               "active); call log_forward_pass outside it")
    else:
        why = ("no parameter or input of the model requires grad; set requires_grad=True "
               "on the input or leave some parameters trainable")
    warnings.warn(f"save_gradients=True, but no logged tensor is part of an autograd graph: "
                  f"{why}. No layer will get grad_contents.", TorchlogWarning, stacklevel=3)


def check_gradient_options(save_gradients: bool, detach_saved_tensors: bool) -> None:
    """Reject option combinations under which backward can never reach the hooks.

    Raises:
        InvalidOptionError: save_gradients with detach_saved_tensors, since the saved
            output would be cut from the graph and nothing could call backward.
    """
    if save_gradients and detach_saved_tensors:
        raise InvalidOptionError(
            "save_gradients=True needs the saved tensors attached to the autograd graph, "
            "but detach_saved_tensors=True was given; use detach_saved_tensors=False so "
            "that `history[output].tensor_contents` can be used to call backward")


def log_backward(history: Any, loss: torch.Tensor) -> None:
    """Run `loss.backward()`, filling `grad_contents` of every pass the gradient reaches.

    A later backward overwrites the gradients of an earlier one.

    Raises:
        InvalidOptionError: the history was not logged with save_gradients=True.
        InvalidArgumentTypeError: `loss` is not a tensor, or is not part of an autograd graph.
    """
    if not history.info.num_gradient_hooks:
        raise InvalidOptionError(
            "this history was logged without gradient hooks; log it with "
            "log_forward_pass(..., save_gradients=True) before calling log_backward")
    if not isinstance(loss, torch.Tensor):
        raise InvalidArgumentTypeError(
            f"loss must be a tensor computed from the saved outputs, got {loss!r}")
    if not loss.requires_grad:
        on_disk = any(isinstance(record.saved, LazyTensor) for record in history)
        raise InvalidArgumentTypeError(
            f"loss {loss!r} does not require grad, so backward cannot reach the model; " + (
                "with save_to, `tensor_contents` is read back from the file, cut from the "
                "graph: compute the loss from the model's own output (kept with "
                "model.register_forward_hook, say)" if on_disk else
                "compute it from `history[label].tensor_contents` of a pass saved attached "
                "(detach_saved_tensors=False)"))
    loss.backward()
