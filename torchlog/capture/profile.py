"""Cost per op with profile=True: bytes autograd saves for backward, and the CUDA allocator's peak.

Saved bytes are counted with `torch.autograd.graph.saved_tensors_hooks`, entered once around
the forward pass: the pack hook adds up the storages autograd saves while an op runs and
hands back a detached alias of the tensor (same memory and version counter), so nothing is
copied and no cycle ties an op's saved output to its own grad_fn. Parameters and buffers are left out: they
stay in memory whatever the op does. As without hooks, backward raises if a saved tensor was
changed in place after it was saved. On CUDA, each op runs between two synchronizations, so
its time includes its kernels, and the peak is `max_memory_allocated()` during the op over
what was allocated when it started.
"""
from __future__ import annotations

from time import perf_counter_ns
from typing import Any

import torch
from torch import nn

__all__ = ["OpProfiler"]


def _storage_key(t: torch.Tensor) -> tuple[int, int]:
    """(storage address, its size in bytes); tensors without a storage count their elements."""
    try:
        storage = t.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, nested, wrapper subclasses
        return id(t), t.element_size() * t.numel()


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # inference tensors carry no version counter
        return -1


class OpProfiler:
    """Counts what each op costs; `start()` before the op, `stop()` after it.

    Ops nest (a Python functional's body runs inside its call): an inner op's bytes and
    peak count for the outer op too.

    Example:
        >>> lin = torch.nn.Linear(4, 4)
        >>> profiler = OpProfiler([("", lin)])
        >>> with profiler:
        ...     token = profiler.start()
        ...     y = torch.relu(lin(torch.ones(2, 4)))
        ...     elapsed_ns = profiler.stop(token, 0)
        >>> profiler.last  # linear keeps its input, relu its output, 32 bytes each; not the weight
        (64, None)
    """

    def __init__(self, named_modules: list[tuple[str, nn.Module]]) -> None:
        kept = [t for _, m in named_modules for t in (*m._parameters.values(), *m._buffers.values())
                if t is not None]
        self._kept = {_storage_key(t)[0] for t in kept}  # stay in memory anyway
        self._seen: set[int] = set()  # storages saved during the current op
        self._saved = 0
        self._peak_floor = 0  # highest peak seen by inner ops since the current op started
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self.last: tuple[int, int | None] = (0, None)  # (saved bytes, peak bytes) of the last op

    def __enter__(self) -> "OpProfiler":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)

    def _pack(self, t: torch.Tensor) -> tuple[torch.Tensor, int]:
        key, nbytes = _storage_key(t)
        if key not in self._kept and key not in self._seen:
            self._seen.add(key)
            self._saved += nbytes
        # A detached alias (same memory, same version counter): the tensor itself would make
        # a cycle for an op that saves its own output (relu): output -> grad_fn -> saved
        # value -> output, which no collector frees when backward never runs.
        return t.detach(), _version(t)

    @staticmethod
    def _unpack(packed: tuple[torch.Tensor, int]) -> torch.Tensor:
        t, version = packed
        if _version(t) != version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an "
                f"inplace operation: a tensor of shape {tuple(t.shape)} is at version "
                f"{_version(t)}; expected version {version} instead (torchlog profile=True "
                "counted it when autograd saved it)")
        return t

    def start(self) -> tuple:
        """Begin an op: a token holding the enclosing op's counts, for `stop`."""
        cuda = torch.cuda.is_initialized()
        base = outer_peak = 0
        if cuda:
            torch.cuda.synchronize()
            base, outer_peak = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        token = (self._saved, self._seen, self._peak_floor, cuda, base, outer_peak)
        self._saved, self._seen, self._peak_floor = 0, set(), 0
        return token

    def stop(self, token: tuple, t0: int) -> int:
        """End the op begun with `token`; sets `last` and returns ns since `t0` (after
        waiting for the op's CUDA kernels)."""
        outer_saved, outer_seen, outer_floor, cuda, base, outer_peak = token
        peak = None
        if cuda:
            torch.cuda.synchronize()
        elapsed = perf_counter_ns() - t0
        if cuda:
            top = max(torch.cuda.max_memory_allocated(), self._peak_floor)
            peak = top - base
            outer_floor = max(outer_floor, top, outer_peak)
        self.last = (self._saved, peak)
        self._seen |= outer_seen
        self._saved += outer_saved
        self._peak_floor = outer_floor
        return elapsed
