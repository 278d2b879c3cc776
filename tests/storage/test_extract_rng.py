"""extract seeds every batch with random_seed + its index and leaves the caller's RNG streams as
they were, whether it saves them once for the whole run (a tensor input) or around each batch."""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
from torch import nn

import torchlog


class Noisy(nn.Module):
    """Draws from torch's, Python's and numpy's global RNGs in forward."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 6)
        self.drop = nn.Dropout(0.5).train()

    def forward(self, x):
        noise = float(np.random.rand()) + random.random()
        return self.drop(self.fc(x)) + noise


def _states() -> tuple:
    return torch.random.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()


def test_a_tensor_input_and_a_list_of_batches_draw_the_same_and_leave_the_caller_alone(tmp_path: Path) -> None:
    x = torch.randn(24, 4, generator=torch.Generator().manual_seed(1))
    models = [Noisy() for _ in range(3)]
    torch.manual_seed(123), random.seed(123), np.random.seed(123)
    before = _states()
    whole = torchlog.extract(models[0], x, ["drop", "add"], tmp_path / "a.h5", batch_size=8, random_seed=5)
    after = _states()
    assert torch.equal(before[0], after[0]) and before[1] == after[1] and np.array_equal(before[2], after[2])
    split = torchlog.extract(models[1], list(x.split(8)), ["drop", "add"], tmp_path / "b.h5", random_seed=5)
    assert torch.equal(torch.random.get_rng_state(), before[0])
    for label in whole:
        np.testing.assert_array_equal(whole[label], split[label])
    rows = whole["dropout_1_2"].reshape(3, 8, 6)
    assert not np.array_equal(rows[0], rows[1])  # each batch its own seed: other masks
    again = torchlog.extract(models[2], x[8:16], ["drop", "add"], tmp_path / "c.h5", batch_size=8, random_seed=6)
    np.testing.assert_array_equal(again["add_1_3"], whole["add_1_3"][8:16])  # batch 1 ran with seed 5 + 1
