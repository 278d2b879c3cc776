"""Copying saved values to another device; from CUDA to the CPU without stalling the forward pass."""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch

__all__ = ["CudaStreams", "DeviceCopier"]


class CudaStreams:
    """The CUDA stream and event calls a `DeviceCopier` makes; tests pass a fake with the
    same methods to check the ordering on a machine without a GPU."""

    def is_async(self, src: torch.Tensor, device: torch.device) -> bool:
        """Whether `src` goes to `device` through the side stream: CUDA to CPU, dense."""
        return src.is_cuda and device.type == "cpu" and src.layout == torch.strided

    def current_stream(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def new_stream(self, device: torch.device) -> Any:
        return torch.cuda.Stream(device)

    def new_event(self) -> Any:
        return torch.cuda.Event()

    def use(self, stream: Any) -> AbstractContextManager:
        return torch.cuda.stream(stream)

    def keep_alive(self, src: torch.Tensor, stream: Any) -> None:
        # The caching allocator must not hand `src`'s memory to a new tensor of the
        # current stream while the side stream may still be reading it.
        src.record_stream(stream)


class DeviceCopier:
    """Copies saved values to `device` (`output_device`) for one forward pass.

    From CUDA to the CPU a copy goes into pinned host memory, non-blocking, on a side
    stream (one per source device, made on first use): an event recorded on the current
    stream after the op orders it after the op, and the forward pass queues its next
    kernels at once. Pinned blocks come from torch's caching host allocator, which reuses
    them, so nothing is pinned per tensor after the first passes. A copy handed out may
    still be landing: `wait(index)`, `wait_for(value)` or `wait_all()` return once it has.
    Before a kernel writes into memory a copy may still be reading, the caller calls
    `before_write()`, which makes the current stream wait for the copies on the GPU (the
    host does not wait). Every other pair of devices gets `src.to(device, copy=True)`, done
    by the time `copy` returns (from the CPU to CUDA through a pinned staging copy).

    Example:
        >>> copier = DeviceCopier(torch.device("cpu"))
        >>> x = torch.ones(2)
        >>> y = copier.copy(x)
        >>> copier.wait_all(); bool(torch.equal(x, y)) and y is not x
        True
    """

    def __init__(self, device: torch.device, streams: CudaStreams | None = None) -> None:
        self.device = device
        self._streams = streams if streams is not None else CudaStreams()
        self._side: dict[torch.device, Any] = {}  # source device -> side stream
        self._done: list[Any] = []  # per copy: its event on the side stream, None if done
        self._last: dict[torch.device, Any] = {}  # source device -> last copy's event
        self._unfenced: set[torch.device] = set()  # devices with copies since before_write
        self._index_of: dict[int, int] = {}  # id(copy) -> index, for copies in flight

    @property
    def num_copies(self) -> int:
        return len(self._done)

    def copy(self, src: torch.Tensor, write_follows: bool = False) -> torch.Tensor:
        """A copy of `src` on this copier's device; its index is `num_copies - 1` after.

        `write_follows`: the next op may write into `src` without announcing it (a buffer
        batch norm updates), so the current stream waits for this copy at once.

        Raises:
            Whatever `Tensor.to` raises for `src` (out of memory, an unsupported layout).
        """
        streams = self._streams
        if streams.is_async(src, self.device):
            return self._copy_async(src, write_follows)
        self._done.append(None)
        if src.device.type == "cpu" and self.device.type == "cuda" and src.layout == torch.strided:
            # A copy from pageable memory would hold the host until the transfer is done.
            return src.pin_memory().to(self.device, non_blocking=True)
        return src.to(self.device, copy=True)

    def _copy_async(self, src: torch.Tensor, write_follows: bool) -> torch.Tensor:
        streams, source = self._streams, src.device
        side = self._side.get(source)
        if side is None:
            side = self._side[source] = streams.new_stream(source)
        current = streams.current_stream(source)
        ready = streams.new_event()
        ready.record(current)  # after the op that made `src`
        side.wait_event(ready)
        with streams.use(side):
            out = src.to(self.device, non_blocking=True, copy=True)  # pinned: torch's _to_copy
        streams.keep_alive(src, side)
        done = streams.new_event()
        done.record(side)
        self._index_of[id(out)] = len(self._done)
        self._done.append(done)
        self._last[source] = done
        if write_follows:
            current.wait_event(done)  # the side stream runs in order: earlier copies too
            self._unfenced.discard(source)
        else:
            self._unfenced.add(source)
        return out

    def before_write(self) -> None:
        """Make later kernels of the current streams wait for every copy made so far, on
        the GPU: call it before an op writes in place into memory a copy may be reading."""
        for source in self._unfenced:
            self._streams.current_stream(source).wait_event(self._last[source])
        self._unfenced.clear()

    def wait(self, index: int) -> None:
        """Return once copy number `index` (0-based, in `copy` order) has landed.

        Raises:
            IndexError: no copy has that index.
        """
        done = self._done[index]
        if done is not None:
            done.synchronize()  # earlier copies on its stream have landed too

    def wait_for(self, value: Any) -> None:
        """Return once `value`, if it is a copy this copier made, has landed."""
        index = self._index_of.get(id(value))
        if index is not None:
            self.wait(index)

    def wait_all(self) -> None:
        """Return once every copy made so far has landed; the values are then complete."""
        for done in self._last.values():
            done.synchronize()
        self._done = [None] * len(self._done)
        self._last.clear()
        self._unfenced.clear()
        self._index_of.clear()
