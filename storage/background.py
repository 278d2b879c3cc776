"""A background thread writing handed-over tensors in order, with a bound on the bytes queued.

Capture hands over each activation without copying it (capture/sink.py). The forward pass
goes on while this thread writes (HDF5 releases the GIL while it writes), and blocks once
the values queued hold `max_bytes`, so memory stays bounded by the queue. A value must not
change before it is written: `settle(index)` copies it while it still waits (or waits
while it is being written), and each value's version counter is compared, after its bytes
were copied out, with the one it had when handed over; a changed value is listed by
`stale()` (a write nothing announced), and the pass must run again copying it.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["DEFAULT_MAX_BYTES", "WriteQueue"]

DEFAULT_MAX_BYTES = 32 << 20  # queued bytes before the forward pass waits for the writer

Write = Callable[[Sequence[Any], int, Any], None]  # (nodes, index, value), in the thread


class _Job:
    __slots__ = ("nodes", "index", "value", "version", "num_bytes")

    def __init__(self, nodes: Sequence[Any], index: int, value: Any, version: int | None,
                 num_bytes: int) -> None:
        self.nodes = nodes
        self.index = index
        self.value = value
        self.version = version  # the version counter at hand-over; None for a copy
        self.num_bytes = num_bytes


class WriteQueue:
    """Values waiting for `write`, called in order on one thread; `close` stops it.

    Used from one producer thread. An error of `write` is kept in `error` (and the
    values after it dropped) for the producer to raise; no method here raises it.
    """

    def __init__(self, write: Write, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._write = write
        self._max_bytes = max_bytes
        self._changed = threading.Condition(threading.Lock())
        self._jobs: deque[_Job] = deque()
        self._waiting: dict[int, _Job] = {}  # index -> job not started yet
        self._busy: _Job | None = None  # the job being written
        self._num_bytes = 0  # in queued jobs and the one being written
        self._stale: list[int] = []
        self._closing = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="torchlog-log-writer", daemon=True)
        self._thread.start()

    def put(self, nodes: Sequence[Any], index: int, value: torch.Tensor, copy: bool = False) -> None:
        """Queue `value` (the activation of node `index`), waiting while the queue is full.

        `copy` (and an inference tensor, which has no version counter) copies it now.
        After an error nothing more is queued.
        """
        try:
            version: int | None = value._version
        except RuntimeError:  # an inference tensor: nothing would tell us it changed
            copy = True
        if copy:
            value, version = value.clone(), None
        num_bytes = value.numel() * value.element_size()
        with self._changed:
            # One value bigger than the bound still passes, alone.
            while self._num_bytes and self._num_bytes + num_bytes > self._max_bytes and self.error is None:
                self._changed.wait()
            if self.error is not None or self._closing:
                return
            job = _Job(nodes, index, value, version, num_bytes)
            self._jobs.append(job)
            self._waiting[index] = job
            self._num_bytes += num_bytes
            self._changed.notify_all()

    def settle(self, index: int | None) -> None:
        """Return once the value of node `index` is written or copied (None: every value
        written, or dropped after an error)."""
        with self._changed:
            if index is None:
                while (self._jobs or self._busy is not None) and self._thread.is_alive():
                    self._changed.wait()
                return
            job = self._waiting.get(index)
            if job is not None:  # still queued: copy it now, so it is not waited for
                self._check(job)
                job.value, job.version = job.value.clone(), None
                return
            while self._busy is not None and self._busy.index == index:
                self._changed.wait()

    def stale(self) -> list[int]:
        """Node indexes whose values changed between hand-over and being copied out."""
        with self._changed:
            return sorted(self._stale)

    def close(self) -> None:
        """Write what is queued, stop the thread and wait for it. Never raises."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _check(self, job: _Job) -> None:
        """Called with the lock held, right after the job's bytes were copied out."""
        if job.version is not None and job.value._version != job.version:
            self._stale.append(job.index)

    def _run(self) -> None:
        changed = self._changed
        while True:
            with changed:
                while not self._jobs and not self._closing:
                    changed.wait()
                if not self._jobs:
                    return
                job = self._busy = self._jobs.popleft()
                if self._waiting.get(job.index) is job:  # a node's value may be queued again (interventions)
                    del self._waiting[job.index]
            try:
                if self.error is None:
                    self._write(job.nodes, job.index, job.value)
            except BaseException as exc:  # kept for the producer, which raises it
                self.error = exc
            with changed:
                self._check(job)
                self._busy = None
                self._num_bytes -= job.num_bytes
                if self.error is not None:  # what follows is dropped: the pass will stop
                    self._jobs.clear()
                    self._waiting.clear()
                    self._num_bytes = 0
                changed.notify_all()
            del job
