"""Models carrying accelerate's hooks: the hooks run unlogged, and the weights they load count as parameters.

`accelerate` (`cpu_offload`, `disk_offload`, `dispatch_model`) replaces a module's `forward`
with one that calls `module._hf_hook.pre_forward` (which loads the module's offloaded
weights from the meta device and moves its arguments to the execution device), then the
module's own forward, then `module._hf_hook.post_forward` (weights back to meta, the output
back to the input's device). torchlog does not import accelerate: it finds such modules by
their `_hf_hook` attribute and, while a pass runs, puts a stand-in there that calls the
same hook with torch functions disabled, so the hook's copies are not ops of the model and
the call numbering is the one the same model has without accelerate. The stand-in tells the
pass's recorder, when there is one, which tensors the hook loaded (the module's parameters
for this call only: accelerate makes new tensor objects at every call, and their ids are
forgotten when post_forward drops them) and which tensors it copied to another device (a
copy reads as its original's node).

A forward that raises skips accelerate's post_forward; the stand-in runs it when the pass
ends, so offloaded weights are back on the meta device however the pass ended.
"""
from __future__ import annotations

import sys
import threading
from typing import Any

import torch
from torch import nn

from torchlog.capture.nesting import find_tensors

__all__ = ["offload_hooks"]


class _State(threading.local):
    recorder: Any = None  # the Recorder of this thread's pass, or None (a lean pass)


_state = _State()
_lock = threading.Lock()
# id(module) -> [stand-in, installs]
_installed: dict[int, list] = {}


class offload_hooks:  # noqa: N801 - used like a function: `with offload_hooks(...):`
    """Stand-ins for the accelerate hooks of `model`'s modules while the block runs; the
    recorder, if given, is told what they load and copy. Costs one dictionary lookup for a
    process that never imported accelerate, and one walk of the modules otherwise."""

    __slots__ = ("model", "named_modules", "recorder", "previous", "hooked")

    def __init__(self, model: nn.Module, named_modules: list | None, recorder: Any = None) -> None:
        self.model, self.named_modules, self.recorder = model, named_modules, recorder
        self.previous: Any = None
        self.hooked: list[tuple[str, nn.Module]] = []

    def __enter__(self) -> None:
        if "accelerate" not in sys.modules:  # no module can carry its hooks
            return
        named = self.named_modules if self.named_modules is not None else self.model.named_modules()
        self.hooked = [(address, module) for address, module in named if "_hf_hook" in module.__dict__]
        if not self.hooked:
            return
        self.previous = _state.recorder
        _state.recorder = self.recorder
        stand_ins = []
        with _lock:
            for address, module in self.hooked:
                entry = _installed.get(id(module))
                if entry is not None:
                    entry[1] += 1
                else:
                    entry = _installed[id(module)] = [_StandIn(module.__dict__["_hf_hook"], address), 1]
                    module.__dict__["_hf_hook"] = entry[0]
                stand_ins.append((module, entry[0]))
        if self.recorder is not None:
            _forget_meta(self.recorder, stand_ins)

    def __exit__(self, *exc_info: object) -> bool:
        if not self.hooked:
            return False
        _state.recorder = self.previous
        with _lock:
            for _, module in self.hooked:
                entry = _installed[id(module)]
                entry[1] -= 1
                if entry[1]:
                    continue
                del _installed[id(module)]
                stand_in = entry[0]
                if module.__dict__.get("_hf_hook") is stand_in:  # else the model replaced it: keep that
                    module.__dict__["_hf_hook"] = stand_in.hook
                stand_in.settle(module)
        self.hooked = []
        return False


def _forget_meta(recorder: Any, stand_ins: list[tuple[nn.Module, _StandIn]]) -> None:
    """Drop the ids of the meta tensors offloading hooks hold from the recorder's tables:
    pre_forward replaces them, and a dead tensor's id may be reused by another tensor."""
    for module, stand_in in stand_ins:
        if not stand_in.offloads:
            continue
        for tensors in (module.parameters(recurse=stand_in.recurse), module.buffers(recurse=stand_in.recurse)):
            for t in tensors:
                if t.is_meta:
                    recorder.param_info.pop(id(t), None)
                    recorder.buffer_addresses.pop(id(t), None)


class _StandIn:
    """In place of a module's accelerate hook while a pass runs: the same hook, unlogged.

    Every attribute but these slots is the hook's own (read and written through), so code
    reading `module._hf_hook.execution_device` or setting `io_same_device` meets the hook.
    """

    __slots__ = ("hook", "address", "offloads", "recurse", "loaded", "pending", "kept")

    def __init__(self, hook: Any, address: str) -> None:
        object.__setattr__(self, "hook", hook)
        object.__setattr__(self, "address", address)
        hooks = getattr(hook, "hooks", (hook,))  # accelerate's SequentialHook holds several
        # Whether pre_forward loads weights, and those of submodules too (`place_submodules`).
        object.__setattr__(self, "offloads", any(getattr(h, "offload", False) is True for h in hooks))
        object.__setattr__(self, "recurse", any(getattr(h, "place_submodules", False) is True for h in hooks))
        object.__setattr__(self, "loaded", [])  # per call running now: ids of what it loaded
        object.__setattr__(self, "pending", 0)  # calls whose post_forward has not run
        # id -> (buffer it loaded, its values then): put back after the pass, as
        # model_kept puts back the buffers it can see (batch norm's running stats)
        object.__setattr__(self, "kept", {})

    def __getattr__(self, name: str) -> Any:
        return getattr(self.hook, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.hook, name, value)

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        with torch._C.DisableTorchFunction():
            moved_args, moved_kwargs = self.hook.pre_forward(module, *args, **kwargs)
        object.__setattr__(self, "pending", self.pending + 1)
        recorder = _state.recorder
        if recorder is not None:
            _note_copies(recorder, (args, kwargs), (moved_args, moved_kwargs))
            if self.offloads:
                self.loaded.append(_note_loaded(recorder, self.address, module, self.recurse, self.kept))
        return moved_args, moved_kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        with torch._C.DisableTorchFunction():
            moved = self.hook.post_forward(module, output)
        object.__setattr__(self, "pending", self.pending - 1)
        recorder = _state.recorder
        if recorder is not None:
            if self.offloads and self.loaded:
                for key in self.loaded.pop():
                    recorder.param_info.pop(key, None)
                    recorder.buffer_addresses.pop(key, None)
            if moved is not output:
                _note_copies(recorder, output, moved)
        return moved

    def settle(self, module: nn.Module) -> None:
        """Run post_forward for the calls that raised before it (offloaded weights back to
        meta), and put back the values of the buffers loaded during the pass."""
        with torch._C.DisableTorchFunction(), torch.no_grad():
            if self.pending:
                object.__setattr__(self, "pending", 0)
                self.loaded.clear()
                self.hook.post_forward(module, None)
            for buffer, values in self.kept.values():
                if not torch.equal(buffer, values):
                    buffer.data.copy_(values)  # through .data, as model_kept does
            self.kept.clear()


def _note_loaded(recorder: Any, address: str, module: nn.Module, recurse: bool, kept: dict) -> list[int]:
    """Register the tensors pre_forward just loaded into `module` (those off the meta
    device) as its parameters and buffers for this call; return their ids. Each buffer's
    values are kept in `kept` at its first load."""
    keys = []
    params, buffers = recorder.param_info, recorder.buffer_addresses
    for name, p in module.named_parameters(prefix=address, recurse=recurse):
        if not p.is_meta and id(p) not in params:  # one kept on its device is known already
            params[id(p)] = name
            keys.append(id(p))
    for name, b in module.named_buffers(prefix=address, recurse=recurse):
        if not b.is_meta and id(b) not in buffers:
            buffers[id(b)] = name
            keys.append(id(b))
            if id(b) not in kept:
                with torch._C.DisableTorchFunction():
                    kept[id(b)] = (b, b.detach().clone())
    return keys


def _note_copies(recorder: Any, before: Any, after: Any) -> None:
    """Tell the recorder of each tensor in `after` that the hook made from the tensor at
    the same place in `before` (a move to another device)."""
    found = dict((path, t) for t, path in find_tensors(before))
    for t, path in find_tensors(after):
        old = found.get(path)
        if old is not None and old is not t:
            recorder.note_copy(old, t)
