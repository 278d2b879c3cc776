"""What log_forward_pass puts back on the user's model afterwards, and how it runs compiled ones."""
from __future__ import annotations

import contextlib
import sys
from typing import Any

import torch
from torch import nn

__all__ = ["compiled_text", "eager_submodules", "has_compiled", "is_compiled", "model_kept", "put_buffers"]


def compiled_text(model: Any, named_modules: list | None = None) -> str | None:
    """The CompiledModelWarning text when `model` or a submodule came from torch.compile."""
    if is_compiled(model):
        return (f"{type(model._orig_mod).__name__} was compiled with torch.compile; torchlog logs "
                "its original module (model._orig_mod) eagerly, so the history shows eager ops, "
                "not the compiled kernels")
    if named_modules is None:
        named_modules = list(model.named_modules()) if isinstance(model, nn.Module) else []
    if "torch._dynamo.eval_frame" not in sys.modules:
        return None  # nothing can have been compiled in this process
    inner = [a for a, m in named_modules if is_compiled(m)]
    if not inner:
        return None
    return (f"submodules {inner!r} were compiled with torch.compile; torchlog runs them eagerly "
            "while logging, so the history shows eager ops, not the compiled kernels")


def eager_submodules(named_modules: list) -> contextlib.AbstractContextManager:
    """Run torch.compile'd submodules eagerly: dynamo would otherwise trace torchlog's own hooks.

    The stance is global to the process, so it is only set for models that need it.
    """
    if not has_compiled(named_modules):
        return contextlib.nullcontext()
    return torch.compiler.set_stance("force_eager")


def has_compiled(named_modules: list) -> bool:
    """Whether a submodule is torch.compile's wrapper (never true before dynamo is imported)."""
    return "torch._dynamo.eval_frame" in sys.modules and any(is_compiled(m) for _, m in named_modules)


def is_compiled(model: Any) -> bool:
    """True for the wrapper torch.compile returns (its module is imported once one exists)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    wrapper = getattr(eval_frame, "OptimizedModule", None)
    return wrapper is not None and isinstance(model, wrapper) and isinstance(
        getattr(model, "_orig_mod", None), nn.Module)


def put_buffers(module: nn.Module, buffers: dict) -> None:
    """Make `module`'s buffers these tensors (by identity), touching its dict only when
    forward reassigned one: another thread may be reading it (two threads logging one model)."""
    current = module._buffers
    if current.keys() != buffers.keys() or any(current[k] is not v for k, v in buffers.items()):
        current.clear()
        current.update(buffers)


class model_kept:  # noqa: N801 - used like a function: `with model_kept(named_modules):`
    """Undo what forward did to the model's buffers and train/eval flags (BatchNorm stats).

    Each pass then starts from the same state (layers_to_save runs the model twice) and
    the model is left as it was. Parameters changed in place are not undone.
    """

    __slots__ = ("named_modules", "flags", "kept")

    def __init__(self, named_modules: list) -> None:
        self.named_modules = named_modules
        self.flags: list = []
        self.kept: list = []

    def __enter__(self) -> None:
        named_modules = self.named_modules
        self.flags = [(module, module.training) for _, module in named_modules]
        if any(module._buffers for _, module in named_modules):
            with torch._C.DisableTorchFunction():  # never logged by an outer log_forward_pass
                # A buffer on the meta device (offloaded by accelerate) holds no values to keep.
                self.kept = [(module, dict(module._buffers),
                              {name: b.detach().clone() for name, b in module._buffers.items()
                               if b is not None and not b.is_meta},
                              {name: b.data for name, b in module._buffers.items() if b is not None and not b.is_meta})
                             for _, module in named_modules if module._buffers]

    def __exit__(self, *exc_info: object) -> bool:
        for module, training in self.flags:
            if module.training is not training:  # Module.__setattr__ is slow: only if changed
                module.training = training
        if self.kept:
            with torch._C.DisableTorchFunction(), torch.no_grad():
                self._restore_buffers()
        return False

    def _restore_buffers(self) -> None:
        for module, buffers, values, own_data in self.kept:
            put_buffers(module, buffers)
            for name, copy in values.items():
                own = own_data[name]
                if buffers[name].data_ptr() != own.data_ptr() or buffers[name].shape != own.shape:
                    buffers[name].data = own  # forward set `b.data = v`: back to its storage
                # Kernels such as batch_norm update running stats without bumping
                # _version, so compare values; copy only what changed.
                if not torch.equal(buffers[name], copy):
                    # Through .data: the version counter stays put, so autograd can
                    # still backpropagate through the batch_norm that updated it.
                    buffers[name].data.copy_(copy)
