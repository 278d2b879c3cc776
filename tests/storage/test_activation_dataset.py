"""Tests of storage/dataset.py: ActivationDataset reads what plain h5py reads, block by block."""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import torchlog
from torchlog.errors import LayerNotFoundError
from torchlog.storage import ActivationDataset

LAYERS = ["linear_1_1", "relu_1_2"]


@pytest.fixture(scope="module")
def acts_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("acts") / "acts.h5"
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU())
    torchlog.extract(net, torch.randn(50, 6), LAYERS, path, batch_size=8, chunks=True)
    return path


def _plain(path: Path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as file:
        return {label: file[f"layers/{label}"][()] for label in LAYERS}


def test_items_are_the_rows_plain_h5py_reads(acts_path: Path) -> None:
    plain = _plain(acts_path)
    data = ActivationDataset(acts_path, layers=["relu_1_2", "linear_1_1"], block_samples=16)
    assert len(data) == 50
    for i in (0, 15, 16, 49, -1):
        relu, linear = data[i]
        assert np.array_equal(relu.numpy(), plain["relu_1_2"][i])
        assert np.array_equal(linear.numpy(), plain["linear_1_1"][i])
    single = ActivationDataset(acts_path, layers=["relu_1_2"])
    assert torch.equal(torch.stack([single[i] for i in range(50)]), torch.from_numpy(plain["relu_1_2"]))


def test_reading_in_order_reads_each_block_once(acts_path: Path) -> None:
    data = ActivationDataset(acts_path, layers=LAYERS, block_samples=16)
    for i in range(len(data)):
        data[i]
    assert data.num_reads == 2 * 4  # two layers, blocks of rows 0-15, 16-31, 32-47, 48-49


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shuffled_dataloader_gives_every_sample_once(acts_path: Path, workers: int) -> None:
    plain = _plain(acts_path)
    data = ActivationDataset(acts_path, layers=["relu_1_2"], block_samples=8)
    loader = DataLoader(data, batch_size=7, shuffle=True, num_workers=workers,
                        generator=torch.Generator().manual_seed(0))
    rows = torch.cat(list(loader))
    assert rows.shape == (50, 5)
    assert sorted(map(tuple, rows.numpy().tolist())) == sorted(map(tuple, plain["relu_1_2"].tolist()))


def test_bfloat16_layers_come_back_in_their_dtype(tmp_path: Path) -> None:
    net = torch.nn.Linear(3, 4).to(torch.bfloat16)
    x = torch.randn(5, 3, dtype=torch.bfloat16)
    torchlog.extract(net, x, ["linear"], tmp_path / "a.h5", batch_size=2)
    data = ActivationDataset(tmp_path / "a.h5")
    with torch.no_grad():
        assert torch.equal(torch.stack([data[i] for i in range(5)]), net(x))


def test_bad_layers_and_indexes_are_named(acts_path: Path) -> None:
    with pytest.raises(LayerNotFoundError, match="no layer 'relu_1_3'.*closest: relu_1_2"):
        ActivationDataset(acts_path, layers=["relu_1_3"])
    with pytest.raises(TypeError, match=r"layers must be a list of layer labels or of the entries "
                       r"extract was given, got .relu_1_2.; e.g. layers=\[.relu_1_2.\]"):
        ActivationDataset(acts_path, layers="relu_1_2")
    with pytest.raises(IndexError, match="sample 50 is outside the 50 samples"):
        ActivationDataset(acts_path)[50]
