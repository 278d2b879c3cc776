"""TensorBoardSink: each batch's values written to an event file, read back with tensorboard's EventAccumulator."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchlog.datasets.driver
from torchlog.datasets import TensorBoardSink, run_dataset
from torchlog.errors import InvalidArgumentTypeError

accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


class Twice(nn.Module):
    """fc, relu, then the same fc2 called twice (its second value a second pass)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 6)
        self.fc2 = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc2(self.fc(x).relu()))


def _events(folder: str) -> object:
    events = accumulator.EventAccumulator(folder, size_guidance={accumulator.SCALARS: 0, accumulator.HISTOGRAMS: 0})
    events.Reload()
    return events


def test_each_batch_writes_a_histogram_and_mean_std_scalars_at_its_index(tmp_path: Path, monkeypatch) -> None:
    def never(*args, **kwargs):
        raise AssertionError("module sites must not run the logged path")

    monkeypatch.setattr(torchlog.datasets.driver, "log_forward_pass", never)
    model = Twice()
    data = torch.randn(23, 4, generator=torch.Generator().manual_seed(1))
    folder = run_dataset(model, data, ["fc", "fc2"], TensorBoardSink(tmp_path), batch_size=8, progress=False)
    assert folder == str(tmp_path)
    events = _events(folder)
    with torch.no_grad():
        batches = [(b, model.fc(b), model.fc2(model.fc(b).relu())) for b in data.split(8)]
    expected = {"fc": [fc for _, fc, _ in batches], "fc2": [first for _, _, first in batches],
                "fc2/pass2": [model.fc2(first) for _, _, first in batches]}
    for tag, values in expected.items():
        means = events.Scalars(f"{tag}/mean")
        stds = events.Scalars(f"{tag}/std")
        histograms = events.Histograms(f"{tag}/activations")
        assert [e.step for e in means] == [e.step for e in stds] == [e.step for e in histograms] == [0, 1, 2]
        for step, value in enumerate(values):
            flat = value.detach().double().numpy().ravel()
            assert means[step].value == pytest.approx(flat.mean(), rel=1e-5, abs=1e-6)
            assert stds[step].value == pytest.approx(flat.std(), rel=1e-5, abs=1e-6)
            seen = histograms[step].histogram_value
            assert seen.num == flat.size and sum(seen.bucket) == flat.size
            assert seen.min == pytest.approx(flat.min(), rel=1e-6) and seen.max == pytest.approx(flat.max(), rel=1e-6)
            counts, _ = np.histogram(flat, bins=len(seen.bucket), range=(flat.min(), flat.max()))
            assert np.abs(np.array(seen.bucket) - counts).sum() <= 2  # bins by float32 edges may move an edge value


def test_a_writer_given_is_left_open_and_anything_else_is_refused(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(tmp_path)) as writer:
        run_dataset(nn.Sequential(nn.ReLU()), [torch.ones(2, 3)], ["0"], TensorBoardSink(writer), progress=False)
        writer.add_scalar("after", 1.0, 0)  # still open
    assert [e.value for e in _events(str(tmp_path)).Scalars("0/mean")] == [1.0]
    with pytest.raises(InvalidArgumentTypeError, match="TensorBoardSink takes a folder"):
        TensorBoardSink(42)
