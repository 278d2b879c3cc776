"""Running a model under capture: the function mode, the module hooks, and the CapturedPass handed on."""
from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import Parameter as _Parameter, is_lazy
from torch.overrides import TorchFunctionMode

from torchlog.capture.boundaries import module_boundaries
from torchlog.capture.call_sites import call_site, mark_boundary
from torchlog.capture.captured import CapturedPass, ModuleInfo
from torchlog.capture.nesting import Attribute, find_tensors
from torchlog.capture.offload import offload_hooks
from torchlog.capture.options import CaptureOptions
from torchlog.capture.plan import StopCapture
from torchlog.capture.recorder import PASS_THROUGH, Recorder
from torchlog.errors import NestedLoggingError

__all__ = ["module_table", "run_captured"]

_new = tuple.__new__  # ModuleInfo(...) without the named tuple's Python-level __new__
_active = threading.local()  # .recording: this thread is inside run_captured


class _CaptureMode(TorchFunctionMode):
    """Hands every torch function, Tensor method and operator called in this thread to the recorder."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.on_op = recorder.on_op
        recorder.mode = self  # pushed again while a Python functional's body runs

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in PASS_THROUGH:  # a metadata read (`x.size()`, `x.shape`): nothing to record
            return func(*args, **kwargs) if kwargs else func(*args)
        return self.on_op(func, args, kwargs or {})


def run_captured(model: nn.Module, args: tuple, kwargs: dict, options: CaptureOptions,
                 named_modules: list | None = None) -> CapturedPass:
    """Run `model(*args, **kwargs)` while recording; undo every hook and the mode after.

    `named_modules` is `list(model.named_modules())` when the caller already walked it.

    Returns:
        The CapturedPass. When forward raises an Exception it is not propagated: the
        pass holds the ops up to that point and `failure.error` is the exception,
        unchanged, for the caller to re-raise.

    Raises:
        NestedLoggingError: this thread is already inside run_captured (a model that
            logs a sub-model from its forward).
        KeyboardInterrupt, SystemExit and other BaseExceptions: unchanged, at once.
        Whatever the sink raises for an input tensor, before the model runs.
    """
    if getattr(_active, "recording", False):
        raise NestedLoggingError(
            "log_forward_pass was called inside another log_forward_pass in the same thread "
            "(a model that logs a sub-model); log the sub-model separately, outside the "
            "outer call")
    recorder = Recorder(model, options, named_modules)
    for t, path in find_tensors((args, kwargs), attributes=True):
        if id(t) not in recorder.producer:
            recorder.add_source(t, "input", _input_name(path))
    try:
        _run_recorded(recorder, model, args, kwargs)
    except StopCapture as stop:  # `stop_after` reached (no error), or an intervention failed
        return recorder.finish(module_table(recorder.named_modules), stop.error)
    except Exception as exc:  # the caller re-raises it once the partial history is built
        return recorder.finish(module_table(recorder.named_modules), exc)
    return recorder.finish(module_table(recorder.named_modules), None)


def _run_recorded(recorder: Recorder, model: nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward under the mode, the module boundaries and the plugins; all removed in `finally`."""
    _active.recording = True
    try:
        extras = recorder.options.plugins or recorder.profiler is not None
        with module_boundaries(recorder, recorder.named_modules), \
                offload_hooks(model, recorder.named_modules, recorder), \
                (contextlib.ExitStack() if extras else contextlib.nullcontext()) as plugins:
            if extras:
                for plugin in recorder.options.plugins:
                    plugins.enter_context(plugin(recorder))
                if recorder.profiler is not None:  # its saved-tensor hooks, for this thread only
                    plugins.enter_context(recorder.profiler)
            recorder.root_frame = sys._getframe()  # call-site searches stop here
            recorder.root_site = call_site()  # the line that called log_forward_pass
            with _CaptureMode(recorder):
                output = model(*args, **kwargs)
        with torch._C.DisableTorchFunction():
            recorder.add_outputs(output)
    finally:
        _active.recording = False
        # The recorder names the mode (which names it back) and frames of this call (whose
        # locals name it): drop them, so that the recorder and its nodes (which hold the
        # saved values) are freed by reference counting, not by the next cyclic collection,
        # and deleting a history frees its activations at once.
        recorder.mode = recorder.root_frame = None
        recorder.module_frames = ()


mark_boundary(_run_recorded.__code__)  # call sites are searched below the model's call only


def module_table(named_modules: list[tuple[str, nn.Module]]) -> tuple[ModuleInfo, ...]:
    """One ModuleInfo per submodule (the root left out), in model order, from one bottom-up sweep.

    Parameters of lazy modules that forward has not yet initialised count as 0. A shared
    submodule's parameters count under its first address only.
    """
    # Per module, not per op, but it runs on every call: a model of hundreds of modules
    # pays for each line here hundreds of times per log.
    canonical = {id(module): address for address, module in named_modules}
    num_params: dict[int, int] = {}  # id(module) -> parameters in it and below it
    children_of: dict[int, tuple[str, ...]] = {}
    registrations = 0  # submodule slots, None ones included
    for address, module in reversed(named_modules):  # children come after their parent
        total = 0
        for p in module._parameters.values():
            if p is not None and (type(p) is _Parameter or not is_lazy(p)):
                total += p.numel()
        if module._modules:
            registrations += len(module._modules)
            total += _add_children(address, module, canonical, num_params, children_of)
        num_params[id(module)] = total
    # Every module but the root fills at least one slot: one slot per module besides the
    # root is a tree (no module registered twice, no None slot), the common case, with no aliases.
    is_tree = registrations == len(named_modules) - 1 or not named_modules
    aliases = {} if is_tree else _aliases(named_modules, canonical)
    empty: tuple = ()
    return tuple([_new(ModuleInfo, (address, type(module).__name__, num_params[id(module)],
                                    children_of.get(id(module), empty),
                                    aliases.get(address, empty) if aliases else empty))
                  for address, module in named_modules if address])


def _add_children(address: str, module: nn.Module, canonical: dict[int, str],
                  num_params: dict[int, int], children_of: dict[int, tuple[str, ...]]) -> int:
    """Note the addresses of a module's direct submodules, a shared one by its first address,
    in `children_of`; return the parameters they hold (each counted under its first address).

    A submodule that is also an ancestor (a cycle) is left out, so walking children ends.
    """
    found = []
    total = 0
    prefix = f"{address}." if address else ""
    for name, child in module._modules.items():
        if child is None:
            continue
        child_address = canonical[id(child)]
        if child_address == prefix + name:  # registered here first: its parameters count here
            total += num_params.get(id(child), 0)
            found.append(child_address)
        elif child_address and child_address != address and not address.startswith(child_address + "."):
            found.append(child_address)  # shared: registered first elsewhere, not an ancestor
    if found:
        children_of[id(module)] = tuple(dict.fromkeys(found))
    return total


def _aliases(named_modules: list[tuple[str, nn.Module]], canonical: dict[int, str]) -> dict[str, tuple]:
    """Other addresses of modules registered more than once (`b.cpe = self.cpe1`), by first address."""
    found: dict[str, list[str]] = {}
    pending = [("", named_modules[0][1], frozenset())]
    while pending:  # every address, depth first; a module inside itself is not entered again
        address, module, ancestors = pending.pop()
        first = canonical[id(module)]
        if first != address:
            found.setdefault(first, []).append(address)
        inside = ancestors | {id(module)}
        pending.extend((f"{address}.{name}" if address else name, child, inside)
                       for name, child in reversed(module._modules.items())
                       if child is not None and id(child) not in inside)
    return {first: tuple(dict.fromkeys(others)) for first, others in found.items()}


def _input_name(path: tuple) -> str:
    # path[0] is 0 for positional args, 1 for kwargs; the rest locates the tensor.
    head, rest = ("args", path[1:]) if path[0] == 0 else ("kwargs", path[1:])
    return head + "".join(f".{p}" if isinstance(p, Attribute) else f"[{p!r}]" for p in rest)
