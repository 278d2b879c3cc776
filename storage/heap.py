"""Keeping glibc's heap from growing while activations stream to disk.

glibc serves big blocks with mmap and returns them to the OS when freed, but after the
first such free it raises its mmap threshold to that block's size, so later activations
come from the heap instead. HDF5's allocations then land between them, freed blocks leave
holes too small for the next one, and the heap grows by about one activation per op:
streaming would use as much memory as logging in memory (tests/storage shows it under an
address-space limit). While a log streams we fix the threshold at 1 MiB, so every big
block is mmapped and returned to the OS once written. Setting it turns glibc's own
adjustment off for good, so afterwards we set the values that adjustment ends at for
tensor workloads (32 MiB, glibc's cap, and twice that for trimming). Elsewhere than
glibc nothing is changed.
"""
from __future__ import annotations

import ctypes
import platform
import threading
from collections.abc import Callable

__all__ = ["STREAMING_THRESHOLD", "RESTORED_THRESHOLD", "streaming_started", "streaming_ended"]

STREAMING_THRESHOLD = 1 << 20  # blocks this big or bigger are mmapped while a log streams
RESTORED_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
_M_TRIM_THRESHOLD = -1  # mallopt parameter numbers, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_lock = threading.Lock()
_num_streaming = [0]  # logs streaming now, across threads


def _mallopt() -> Callable[[int, int], int] | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None


def streaming_started() -> bool:
    """Mmap every big block from now on; True when the setting was made (glibc only)."""
    mallopt = _mallopt()
    if mallopt is None:
        return False
    with _lock:
        _num_streaming[0] += 1
        return bool(mallopt(_M_MMAP_THRESHOLD, STREAMING_THRESHOLD))


def streaming_ended() -> None:
    """Once no log streams any more, let big blocks come from the heap again."""
    mallopt = _mallopt()
    if mallopt is None:
        return
    with _lock:
        _num_streaming[0] = max(0, _num_streaming[0] - 1)
        if _num_streaming[0] == 0:
            mallopt(_M_MMAP_THRESHOLD, RESTORED_THRESHOLD)
            mallopt(_M_TRIM_THRESHOLD, 2 * RESTORED_THRESHOLD)
