"""Models and data for the extract command tests, named on the command line as
`tests.storage.extract_factories:<function>` (torchrun's ranks import them).

Two environment variables let a test stop a rank at a known batch, never at a guessed time:
- TORCHLOG_TEST_KILL="rank:batch:folder": that rank, about to load that global batch,
  waits until folder/parked exists, then kills itself with SIGKILL;
- TORCHLOG_TEST_PARK="rank:batch:folder": that rank, about to load that batch, writes
  folder/parked and blocks until it is killed.
A rank loads a batch only after it flushed the batch before, so either stop leaves its
shard exactly as it was after its last finished batch.
"""
from __future__ import annotations

import os
import signal
import threading
import time

import torch
from torch import nn

NUM_SAMPLES = 48
BATCH_SIZE = 4
MARKED_SAMPLE = 41  # in batch 10: the changing model runs one more op on it
LAYERS = ["relu_1_2", "linear_2_3"]


class Net(nn.Module):
    """fc1 -> relu -> fc2, and one more op after them for a batch holding a marked sample."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 3)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator))
        self.changes = False
        self.changes_early = False
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.changes_early and self.calls == 11:  # batch 10 in one process (counted: a test ran no op)
            x = x * 1  # before the saved layers: their call numbers move, their places do not
        out = self.fc2(torch.relu(self.fc1(x)))
        if self.changes and bool((x[:, 0] > 50).any()):
            out = out * 2  # after the saved layers: their labels stay, the op sequence changes
        return out


def model() -> nn.Module:
    """The plain model."""
    return Net().eval()


def changing_model() -> nn.Module:
    """The model whose op sequence changes for the batch holding the marked sample."""
    net = Net().eval()
    net.changes = True
    return net


def early_changing_model() -> nn.Module:
    """The model that runs one more op before the saved layers in its 11th call (batch 10 in one process)."""
    net = Net().eval()
    net.changes_early = True
    return net


class Samples(torch.utils.data.Dataset):
    """NUM_SAMPLES fixed samples of width 8; sample MARKED_SAMPLE has 100 in feature 0."""

    def __init__(self) -> None:
        self.values = torch.randn(NUM_SAMPLES, 8, generator=torch.Generator().manual_seed(1))
        self.values[MARKED_SAMPLE, 0] = 100.0

    def __len__(self) -> int:
        return NUM_SAMPLES

    def __getitem__(self, index: int) -> torch.Tensor:
        if index % BATCH_SIZE == 0:
            _maybe_stop(index // BATCH_SIZE)
        return self.values[index]


def data() -> torch.utils.data.Dataset:
    """The samples."""
    return Samples()


def _maybe_stop(batch: int) -> None:
    rank = os.environ.get("RANK", "0")
    for name in ("TORCHLOG_TEST_PARK", "TORCHLOG_TEST_KILL"):
        spec = os.environ.get(name)
        if not spec:
            continue
        at_rank, at_batch, folder = spec.split(":", 2)
        if at_rank != rank or int(at_batch) != batch:
            continue
        parked = os.path.join(folder, "parked")
        if name == "TORCHLOG_TEST_PARK":
            open(parked, "w").close()
            threading.Event().wait()  # until torchrun ends this rank
        while not os.path.exists(parked):  # waits for the other rank's file, whatever it takes
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)
