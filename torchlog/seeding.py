"""Seeding the global RNGs for a logged pass and putting them back afterwards."""
from __future__ import annotations

import os
import random
import sys
from contextlib import contextmanager
from collections.abc import Iterator

import torch


def new_seed() -> int:
    """A fresh seed that does not consume any global RNG."""
    return int.from_bytes(os.urandom(4), "little") % (2**32 - 1) + 1


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed torch, Python and (if imported) numpy RNGs; restore their states on exit."""
    torch_state = torch.random.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    py_state = random.getstate()
    np = sys.modules.get("numpy")
    np_state = np.random.get_state() if np is not None else None
    try:
        torch.random.default_generator.manual_seed(seed)
        if cuda_states is not None:  # never initialise CUDA just to seed it
            torch.cuda.manual_seed_all(seed)
        random.seed(seed)
        if np is not None:
            np.random.seed(seed % 2**32)
        yield
    finally:
        torch.random.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
        random.setstate(py_state)
        if np is not None:
            np.random.set_state(np_state)
