"""Module boundaries: each submodule's `forward` wrapped while a pass runs, to keep the module stack.

Why not module hooks. A global forward pre-hook and forward hook (what capture used before)
send every module call in the process down torch's slow path (`_call_impl`'s `inner`,
which builds hook lists and checks each hook's flags): 8.3 µs per call of a one-op module
here, under a do-nothing mode, before our own hooks did anything. A wrapper on the
instance is looked up by `_call_impl`'s fast path (`self.forward`), costs 1.5 µs measured
the same way, and sees exceptions through its own `try`.

The wrapper goes in the module's instance `__dict__` (never on its class), so other
instances of the class are untouched. It is installed when a logging pass starts and
removed in `finally`; passes of several threads over shared modules count installs per
module, and the last one out puts back exactly what was there (the class's method, or an
instance attribute the user had set). The wrapper records only for the recorder of the
thread that runs it (a thread-local), and only modules of that recorder's model; every
other call goes straight to the original forward.

A module with forward pre-hooks of its own (weight_norm and spectral_norm compute its
weight in one) is on torch's slow path anyway: it gets a pre-hook and an always-called
forward hook of ours instead, put first, so the ops of its pre-hooks run inside it, as
they did with global hooks. What differs from global hooks: `module.forward(x)` called
directly counts as a call of the module. A TorchScript submodule is wrapped the same way
(its `forward` is an instance attribute already, put back afterwards). Modules that an
`nn.DataParallel` over several devices copies on every call are not wrapped (see
`_replicated`). A copy of a submodule made by the model during forward
(`copy.deepcopy(self.block)`) carries the wrapper, which runs the original's forward.
"""
from __future__ import annotations

import sys
import threading
from typing import Any

from torch import nn

__all__ = ["module_boundaries", "module_caller"]


class _State(threading.local):
    recorder: Any = None  # the Recorder of this thread's pass, or None


_state = _State()
_lock = threading.Lock()
# id(module) -> [wrapper, the instance's own `forward` attribute before it (or _ABSENT),
# installs, module (held: its id stays its own)]
_installed: dict[int, list] = {}
_ABSENT = object()
_getframe = sys._getframe
_CALL_IMPL_CODE = nn.Module._call_impl.__code__
_WRAPPED_CALL_CODE = nn.Module._wrapped_call_impl.__code__


class module_boundaries:  # noqa: N801 - used like a function: `with module_boundaries(...):`
    """Feed `recorder.enter` and `recorder.leave` (or `leave_raised`) at every call of a
    submodule of `named_modules` (the root left out) in this thread while the block runs;
    undo everything on leaving it, however it is left."""

    __slots__ = ("recorder", "named_modules", "previous", "wrapped", "handles")

    def __init__(self, recorder: Any, named_modules: list[tuple[str, nn.Module]]) -> None:
        self.recorder, self.named_modules = recorder, named_modules
        self.previous: Any = None
        self.wrapped: list[nn.Module] = []
        self.handles: list = []

    def __enter__(self) -> None:
        self.previous = _state.recorder
        _state.recorder = self.recorder
        try:
            replicated = _replicated(self.named_modules)
            plain = []  # modules to wrap
            with _lock:
                for address, module in self.named_modules:
                    if not address or (replicated and address.startswith(replicated)):
                        continue
                    if module._forward_pre_hooks:
                        # Ops of its own pre-hooks (weight_norm's, spectral_norm's) run
                        # inside it: hooks of ours that run before them and see the
                        # output before its forward hooks do. It takes torch's slow
                        # path for its hooks anyway.
                        self.handles += _hooks(module, address, self.recorder)
                    else:
                        plain.append(module)
                _install(plain, self.wrapped)
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc_info: object) -> bool:
        _state.recorder = self.previous
        for handle in self.handles:
            handle.remove()
        self.handles = []
        with _lock:
            _uninstall(self.wrapped)
        self.wrapped = []
        return False


def module_caller(frame: Any) -> Any:
    """The frame that called the module whose forward `frame` runs (its wrapper's frame, or
    torch's hook-calling frame): through `module(x)`, past torch's _call_impl and
    _wrapped_call_impl; where those are not there, the frame right above."""
    start = frame.f_back
    if start.f_code is _CALL_IMPL_CODE:
        start = start.f_back
        if start.f_code is _WRAPPED_CALL_CODE:
            start = start.f_back
    return start


def _hooks(module: nn.Module, address: str, recorder: Any) -> list:
    """A pre-hook and an always-called forward hook on `module`, ahead of its own; their handles."""

    def enter(_module: nn.Module, args: Any, kwargs: Any) -> Any:
        if _state.recorder is recorder:
            recorder.enter(address, _getframe(1))  # torch's frame that runs forward
            if recorder.acting_inputs:  # module-input sites of a plan: what forward receives
                return recorder.act_on_inputs(address, args, kwargs)
        return None

    def leave(_module: nn.Module, _args: Any, output: Any) -> None:
        if _state.recorder is not recorder:
            return
        if _getframe(1).f_code is _CALL_IMPL_CODE:  # called from _call_impl's `except`: it raised
            recorder.leave_raised(address)
            return None
        return recorder.leave(address, output)  # `output`, or an intervention's replacement

    return [module.register_forward_pre_hook(enter, prepend=True, with_kwargs=True),
            module.register_forward_hook(leave, prepend=True, always_call=True)]


def _replicated(named_modules: list[tuple[str, nn.Module]]) -> tuple[str, ...]:
    """Address prefixes of the modules a DataParallel over several devices copies on every
    call: a copy's `__dict__` is the original's, so it would call the original's wrapper.

    Their forwards run in DataParallel's worker threads, which are never logged, so they
    are left unwrapped (and their module calls unseen, as their ops are).
    """
    return tuple(f"{address}." if address else "" for address, module in named_modules
                 if isinstance(module, nn.DataParallel) and len(module.device_ids or ()) > 1)


def _install(modules: list[nn.Module], done: list[nn.Module]) -> None:
    """Wrap each module's forward, or count one more install of the wrapper it has, and
    append it to `done` (for `_uninstall`, also when a later one fails); under `_lock`."""
    installed = _installed
    for module in modules:  # per module per call: inlined, no call per module
        entry = installed.get(id(module))
        if entry is not None:
            entry[2] += 1
        else:
            own = module.__dict__
            wrapper = _wrapper(id(module), module.forward)
            installed[id(module)] = [wrapper, own.get("forward", _ABSENT), 1, module]
            own["forward"] = wrapper  # not through nn.Module.__setattr__: a plain instance attribute
        done.append(module)


def _uninstall(modules: list[nn.Module]) -> None:
    """Undo one `_install` of each module; the last one out puts back what was there."""
    installed = _installed
    for module in modules:
        entry = installed[id(module)]
        entry[2] -= 1
        if entry[2]:
            continue
        del installed[id(module)]
        wrapper, previous = entry[0], entry[1]
        own = module.__dict__
        if own.get("forward") is not wrapper:
            continue  # forward replaced it meanwhile: leave the model's own change
        if previous is _ABSENT:
            del own["forward"]
        else:
            own["forward"] = previous


def _wrapper(key: int, forward: Any) -> Any:
    """`forward` that tells this thread's recorder, if it logs the module `key`, when it runs."""

    def forward_logged(*args: Any, **kwargs: Any) -> Any:
        recorder = _state.recorder
        if recorder is None:
            return forward(*args, **kwargs)
        address = recorder.module_addresses.get(key)
        if address is None:  # a module of another model, shared with this one's thread
            return forward(*args, **kwargs)
        recorder.enter(address, _getframe())
        try:
            if recorder.acting_inputs:  # module-input sites of a plan: what forward receives
                args, kwargs = recorder.act_on_inputs(address, args, kwargs)
            output = forward(*args, **kwargs)
        except BaseException:
            recorder.leave_raised(address)
            raise
        return recorder.leave(address, output)  # `output`, or an intervention's replacement

    forward_logged.__wrapped__ = forward  # inspect.signature(module.forward) still reads the original
    return forward_logged
