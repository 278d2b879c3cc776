"""The calls of a patched run upstream of its first edit, served from a recorded run instead of recomputed.

Every patched run of a sweep runs the same corrupted input, so until its first edit fires
it makes exactly the calls of any other run, with the same results. One run records its
calls (function, arguments, result) up to its first edit; a later run is served a recorded
result instead of making the call while it has not fired and the call is the recorded one:
the same function, the same tensor objects as arguments (the served results themselves, the
parameters, the inputs) at the same version counters, and equal other arguments. A result
whose tensors were written in place since it was recorded is recomputed, and so is every
call after a call that differs. Each served call thus gets the arguments it was recorded
with, so its result is the one it would compute again, as long as the ops are
deterministic: a recording run that drew random numbers (torch's CPU generator, or CUDA's
once initialised) records nothing. The sweep runs its patches latest site first, so that the
first run's record covers the others' upstream calls.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["MAX_RECORDED_BYTES", "Prefix", "rng_states", "same_states"]

# Recording stops once the recorded results hold this many bytes (the rest is recomputed):
# a record keeps the upstream values of a whole batched forward alive for the sweep.
MAX_RECORDED_BYTES = 1 << 30

_SCALARS = frozenset((int, float, complex, bool, str, bytes, type(None), type(...), torch.dtype, torch.device,
                      torch.layout, torch.memory_format))


class Prefix:
    """The record of one run's calls up to its first edit, served to later runs.

    `serving(reached)` is the mode for one run: `reached` is the run's set of edits fired,
    empty until the first one fires. The first run that completes records; later runs serve.
    """

    __slots__ = ("records", "num_served")

    def __init__(self) -> None:
        self.records: list[tuple] | None = None  # (func, key, refs, result, versions) per call
        self.num_served = 0  # calls served so far, over all runs (tests read it)

    def serving(self, reached: set) -> "_PrefixMode":
        return _PrefixMode(self, reached)


class _PrefixMode(TorchFunctionMode):
    """Serves recorded results to one run until an edit has fired, or records the run."""

    def __init__(self, prefix: Prefix, reached: set) -> None:
        super().__init__()
        self.prefix = prefix
        self.reached = reached
        self.served = prefix.records or []
        self.recording: list[tuple] | None = [] if prefix.records is None else None
        self.index = 0  # calls seen before the first edit
        self.recorded_bytes = 0
        self.rng: list[torch.Tensor] = []

    def __enter__(self) -> "_PrefixMode":
        if self.recording is not None:
            self.rng = rng_states()
        return super().__enter__()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        super().__exit__(exc_type, exc, tb)
        if exc_type is None and self.recording is not None and same_states(self.rng, rng_states()):
            self.prefix.records = self.recording

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self.reached or self.index < 0:
            return func(*args, **kwargs)
        index = self.index
        self.index += 1
        refs: list[Any] = []
        # Taken before the call: an in-place op moves a version.
        key = _key(args, refs) if not kwargs else (_key(args, refs), _key(kwargs, refs))
        if index < len(self.served):
            recorded_func, recorded_key, _, result, versions = self.served[index]
            # A getter (`Tensor.shape.__get__`) is a new bound object each time: equal, not identical.
            if (recorded_func is not func and recorded_func != func) or recorded_key != key:
                self.index = -1  # the run makes other calls from here: nothing more to serve
                return func(*args, **kwargs)
            if versions is not None and versions == _versions(result):
                self.prefix.num_served += 1
                return result
            return func(*args, **kwargs)
        if self.recording is None:
            self.index = -1  # past the record: nothing more to serve
            return func(*args, **kwargs)
        result = func(*args, **kwargs)
        self._record(func, key, refs, result)
        return result

    def _record(self, func: Callable, key: Any, refs: list, result: Any) -> None:
        versions = _versions(result)
        if versions is not None:
            tensors = (result,) if isinstance(result, torch.Tensor) else result
            self.recorded_bytes += sum(t.numel() * t.element_size() for t in tensors)
            if self.recorded_bytes > MAX_RECORDED_BYTES:
                self.index = -1  # stop recording: what is recorded so far stays servable
                return
        self.recording.append((func, key, refs, result, versions))


def _key(value: Any, refs: list) -> Any:
    """A comparable stand-in for a call's arguments: tensors by identity and version
    (`refs` keeps them alive, so that no other object takes their id), containers
    element by element, scalars by type and value, anything else by identity."""
    if isinstance(value, torch.Tensor):
        refs.append(value)
        return (id(value), value._version)
    cls = type(value)
    if cls in _SCALARS:
        return (cls, value)
    if cls is tuple or cls is list or isinstance(value, (tuple, list)):
        return (cls, tuple([_key(v, refs) for v in value]))
    if isinstance(value, dict):
        return (dict, tuple([(k, _key(v, refs)) for k, v in value.items()]))
    if cls is slice:
        return (slice, _key((value.start, value.stop, value.step), refs))
    refs.append(value)
    return (object, id(value))


def _versions(result: Any) -> tuple | None:
    """The version counters of a servable result (a tensor or a tuple of tensors), or
    None for a result served never (a list the model might change, a number made from
    values)."""
    if isinstance(result, torch.Tensor):
        return (result._version,)
    if isinstance(result, tuple) and result and all(isinstance(t, torch.Tensor) for t in result):
        return tuple(t._version for t in result)
    return None


def rng_states() -> list[torch.Tensor]:
    """The states of torch's CPU generator and, once CUDA is initialised, its CUDA ones:
    equal before and after a run that drew no random numbers."""
    states = [torch.get_rng_state()]
    if torch.cuda.is_initialized():
        states += torch.cuda.get_rng_state_all()
    return states


def same_states(before: list[torch.Tensor], after: list[torch.Tensor]) -> bool:
    return len(before) == len(after) and all(torch.equal(a, b) for a, b in zip(before, after))
