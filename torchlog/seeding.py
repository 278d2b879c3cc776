"""Seeding the global RNGs for a logged pass and putting them back afterwards."""
from __future__ import annotations

import os
import random
import sys
import threading
from contextlib import contextmanager
from collections.abc import Iterator

import torch

__all__ = ["new_seed", "seeded"]


def new_seed() -> int:
    """A fresh seed that does not consume any global RNG."""
    return int.from_bytes(os.urandom(4), "little") % (2**32 - 1) + 1


_lock = threading.Lock()
_saved: list = []  # the states from before the first of the passes now running
_depth = 0


@contextmanager
def seeded(seed: int, numpy: bool = True) -> Iterator[None]:
    """Seed torch, Python and (if imported and `numpy`) numpy RNGs; restore their states on exit.

    Saving and restoring numpy's global state costs about 0.2 ms, more than logging a
    small model: callers skip it when no seed was asked for.

    Threads logging at the same time share the global generators: the first to enter
    saves the states and the last to leave restores them, so the caller's RNG state
    survives any overlap. (Random ops of two overlapping logs draw from one generator,
    so such runs cannot be reproduced from their seeds.)
    """
    global _depth
    np = sys.modules.get("numpy") if numpy else None
    with _lock:
        if _depth == 0:
            _saved[:] = [_capture_states(np)]
        _depth += 1
        cuda_initialized = torch.cuda.is_initialized()
        torch.random.default_generator.manual_seed(seed)
        if cuda_initialized:  # never initialise CUDA just to seed it
            torch.cuda.manual_seed_all(seed)
        random.seed(seed)
        if np is not None:
            np.random.seed(seed % 2**32)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _restore_states(_saved.pop(), sys.modules.get("numpy"))


def _capture_states(np) -> tuple:
    return (
        torch.random.get_rng_state(),
        torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
        random.getstate(),
        np.random.get_state() if np is not None else None,
    )


def _restore_states(states: tuple, np) -> None:
    torch_state, cuda_states, py_state, np_state = states
    torch.random.set_rng_state(torch_state)
    if cuda_states is not None:
        torch.cuda.set_rng_state_all(cuda_states)
    random.setstate(py_state)
    if np is not None and np_state is not None:
        np.random.set_state(np_state)
