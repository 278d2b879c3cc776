"""Pausing Python's cyclic garbage collector while a pass is logged."""
from __future__ import annotations

import gc
import threading

__all__ = ["collector_paused"]

_lock = threading.Lock()
_depth = 0  # logged passes running now, in any thread
_was_enabled = False  # the collector's state before the first of them


class collector_paused:  # noqa: N801 - used like a function: `with collector_paused():`
    """Turn the cyclic collector off for the block; on leaving, turn it back on if it was on.

    Logging allocates a few small objects per op, and most of them live as long as the
    history: the collector's generation-0 and -1 sweeps over them, and the rare full sweep
    over every object torch imported, took 7-10% of the log time (bench/). Reference
    counting still frees everything that is not in a cycle at once; cycles made during
    the pass wait for the first collection after it. Overlapping passes in several
    threads share one pause: the first to enter turns the collector off, the last to
    leave turns it back on, and only if it was on before the first entered.
    """

    __slots__ = ()

    def __enter__(self) -> None:
        global _depth, _was_enabled
        with _lock:
            if _depth == 0:
                _was_enabled = gc.isenabled()
                gc.disable()
            _depth += 1

    def __exit__(self, *exc_info: object) -> bool:
        global _depth
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
        return False
