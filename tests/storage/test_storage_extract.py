"""Tests of torchlog/datasets/extraction.py with storage/extraction.py (its HDF5 sink) and
storage/arrays.py: layers over a dataset, resumable."""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchlog
from torchlog.errors import (
    InvalidOptionError,
    LayerNotFoundError,
    LogFileError,
    LogFileExistsError,
)
from torchlog.storage import open_activations

LAYERS = ["relu_1_2", "linear_2_3"]


class Net(nn.Module):
    """Two linear layers; counts the samples it has seen, to show which batches ran."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(3, 5)
        self.fc2 = nn.Linear(5, 2)
        self.seen = 0

    def forward(self, x):
        self.seen += x.shape[0]
        return self.fc2(torch.relu(self.fc1(x)))


def _expected(net: Net, data: torch.Tensor) -> dict[str, np.ndarray]:
    with torch.no_grad():
        hidden = torch.relu(net.fc1(data))
        return {"relu_1_2": hidden.numpy(), "linear_2_3": net.fc2(hidden).numpy()}


@pytest.mark.parametrize("source", ["tensor", "dataloader", "samples", "list of batches"])
def test_layers_are_appended_batch_by_batch_into_one_array_each(tmp_path: Path, source: str) -> None:
    data = torch.randn(23, 3)
    inputs, batch_size = {
        "tensor": (data, 5),
        "dataloader": (DataLoader(TensorDataset(data), batch_size=5), None),
        "samples": (list(data), 5),
        "list of batches": (list(data.split(5)), None),
    }[source]
    net = Net()
    acts = torchlog.extract(net, inputs, LAYERS, tmp_path / "acts.h5", batch_size=batch_size)
    expected = _expected(net, data)
    assert acts.num_samples == 23 and acts.is_complete and list(acts) == LAYERS
    for label in LAYERS:
        np.testing.assert_allclose(acts[label], expected[label], rtol=1e-6, atol=1e-6)
    with h5py.File(tmp_path / "acts.h5", "r") as file:  # plain h5py sees the same arrays
        assert file["layers/relu_1_2"].shape == (23, 5)
        assert list(file["batch_sizes"][()]) == [5, 5, 5, 5, 3]
        np.testing.assert_array_equal(file["layers/linear_2_3"][()], acts["linear_2_3"])


def _interrupted(data: torch.Tensor, after: int):
    """Yields batches of 4, then raises KeyboardInterrupt as if the user pressed Ctrl-C."""
    for i, batch in enumerate(data.split(4)):
        if i == after:
            raise KeyboardInterrupt
        yield batch


def test_a_rerun_after_an_interruption_skips_the_batches_already_written(tmp_path: Path) -> None:
    data, path = torch.randn(30, 3), tmp_path / "acts.h5"
    net = Net()
    with pytest.raises(KeyboardInterrupt):
        torchlog.extract(net, _interrupted(data, after=3), LAYERS, path)
    partial = open_activations(path)
    assert partial.num_samples == 12 and not partial.is_complete
    net.seen = 0
    acts = torchlog.extract(net, list(data.split(4)), LAYERS, path)
    resumed, net.seen = net.seen, 0
    torchlog.extract(net, list(data.split(4)), LAYERS, tmp_path / "fresh.h5")
    # Only the batches after the interruption ran, once each (the first one logged).
    assert (resumed, net.seen) == (18, 30)
    np.testing.assert_allclose(acts["relu_1_2"], _expected(net, data)["relu_1_2"], rtol=1e-6, atol=1e-6)
    assert acts.is_complete


def test_a_batch_cut_off_half_written_is_dropped_on_resume(tmp_path: Path) -> None:
    data, path = torch.randn(12, 3), tmp_path / "acts.h5"
    net = Net()
    with pytest.raises(KeyboardInterrupt):
        torchlog.extract(net, _interrupted(data, after=2), LAYERS, path)
    with h5py.File(path, "r+") as file:  # one layer got a third batch, the other did not
        file["layers/relu_1_2"].resize(12, axis=0)
    assert open_activations(path).shapes["relu_1_2"] == (8, 5)
    acts = torchlog.extract(net, list(data.split(4)), LAYERS, path)
    np.testing.assert_allclose(acts["relu_1_2"], _expected(net, data)["relu_1_2"], rtol=1e-6, atol=1e-6)


def test_resuming_with_other_inputs_is_refused(tmp_path: Path) -> None:
    data, path = torch.randn(12, 3), tmp_path / "acts.h5"
    with pytest.raises(KeyboardInterrupt):
        torchlog.extract(Net(), _interrupted(data, after=2), LAYERS, path)
    with pytest.raises(LogFileError, match="batch 0 has 3 samples but the interrupted run wrote 4"):
        torchlog.extract(Net(), list(data.split(3)), LAYERS, path)


def test_an_existing_file_of_another_kind_or_other_layers_is_refused_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "acts.h5"
    path.write_bytes(b"not mine")
    with pytest.raises(LogFileExistsError, match="acts.h5' exists and cannot be resumed: it is not an HDF5"):
        torchlog.extract(Net(), torch.randn(4, 3), LAYERS, path, batch_size=2)
    assert path.read_bytes() == b"not mine"
    torchlog.extract(Net(), torch.randn(4, 3), LAYERS, path, batch_size=2, overwrite=True)
    with pytest.raises(LogFileExistsError, match="layers .*relu_1_2.*, not"):
        torchlog.extract(Net(), torch.randn(4, 3), ["relu_1_2"], path, batch_size=2)
    log = tmp_path / "run.h5"
    torchlog.log_forward_pass(Net(), torch.randn(2, 3), save_to=log)
    with pytest.raises(LogFileExistsError, match="run.h5' is a 'torchlog' file"):
        torchlog.extract(Net(), torch.randn(4, 3), LAYERS, log, batch_size=2)


def test_the_progress_bar_is_silent_off_a_terminal_and_shown_when_asked(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    torchlog.extract(Net(), torch.randn(6, 3), LAYERS, tmp_path / "a.h5", batch_size=2)
    assert capsys.readouterr().err == ""
    torchlog.extract(Net(), torch.randn(6, 3), LAYERS, tmp_path / "b.h5", batch_size=2, progress=True)
    assert "3/3" in capsys.readouterr().err


def test_bfloat16_layers_keep_their_dtype_as_tensors(tmp_path: Path) -> None:
    net = nn.Sequential(nn.Linear(3, 4)).to(torch.bfloat16)
    data = torch.randn(6, 3, dtype=torch.bfloat16)
    acts = torchlog.extract(net, data, ["linear_1_1"], tmp_path / "acts.h5", batch_size=4)
    with torch.no_grad():
        expected = net(data)
    assert torch.equal(acts.tensor("linear_1_1"), expected)
    assert acts["linear_1_1"].dtype == np.float32
    np.testing.assert_array_equal(acts["linear_1_1"], expected.float().numpy())


def test_a_layer_not_in_the_file_is_reported_with_the_file(tmp_path: Path) -> None:
    acts = torchlog.extract(Net(), torch.randn(4, 3), LAYERS, tmp_path / "acts.h5", batch_size=2)
    with pytest.raises(LayerNotFoundError, match="no layer 'relu_1_3' in '.*acts.h5'.*closest: relu_1_2"):
        acts["relu_1_3"]


def test_layers_without_a_sample_axis_are_refused(tmp_path: Path) -> None:
    class Pooled(nn.Module):
        def forward(self, x):
            return x.sum()

    with pytest.raises(LogFileError, match="layer 'sum_1_1' gave \\(\\) for a batch of 2 samples"):
        torchlog.extract(Pooled(), torch.randn(4, 3), ["sum"], tmp_path / "acts.h5", batch_size=2)


def test_bad_arguments_are_refused_before_any_batch(tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match="list of layers"):
        torchlog.extract(Net(), torch.randn(4, 3), "all", tmp_path / "a.h5")
    with pytest.raises(InvalidOptionError, match="batch_size"):
        torchlog.extract(Net(), torch.randn(4, 3), LAYERS, tmp_path / "a.h5", batch_size=0)
    assert not (tmp_path / "a.h5").exists()


def test_layers_are_contiguous_when_the_size_is_known_else_in_chunks_of_batches(tmp_path: Path) -> None:
    data = torch.randn(23, 3)
    layouts = {"default": {}, "chunked": {"chunks": True}, "rows": {"chunks": 7},
               "gzip": {"compression": "gzip"}}
    for name, options in layouts.items():
        acts = torchlog.extract(Net(), data, LAYERS, tmp_path / f"{name}.h5", batch_size=5, **options)
        np.testing.assert_allclose(acts["relu_1_2"], _expected(Net(), data)["relu_1_2"], rtol=1e-6, atol=1e-6)
    with h5py.File(tmp_path / "default.h5") as file:  # the size is known: allocated whole
        assert file["layers/relu_1_2"].chunks is None and file["layers/relu_1_2"].shape == (23, 5)
    with h5py.File(tmp_path / "chunked.h5") as file:  # small samples: as many batches as fit in 1 MiB
        assert file["layers/relu_1_2"].chunks == (23, 5)
    with h5py.File(tmp_path / "rows.h5") as file:
        assert file["layers/relu_1_2"].chunks == (7, 5)
    with h5py.File(tmp_path / "gzip.h5") as file:  # compressed: in chunks of whole batches
        assert file["layers/relu_1_2"].compression == "gzip" and file["layers/relu_1_2"].chunks == (23, 5)
    growing = torchlog.extract(Net(), list(data.split(5)), LAYERS, tmp_path / "grown.h5")
    with h5py.File(growing.path) as file:  # size unknown: grows in chunks of whole batches
        rows, width = file["layers/relu_1_2"].chunks
        assert rows % 5 == 0 and rows * width * 4 <= 1 << 20 < (rows + 5) * width * 4
        assert file["layers/relu_1_2"].maxshape == (None, 5)


def test_contiguous_storage_needs_a_known_size_and_no_compression(tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match="chunks=False .* got compression='gzip'"):
        torchlog.extract(Net(), torch.randn(4, 3), LAYERS, tmp_path / "a.h5", batch_size=2,
                         chunks=False, compression="gzip")
    with pytest.raises(InvalidOptionError, match="chunks=False .* and generator inputs"):
        torchlog.extract(Net(), (b for b in torch.randn(4, 3).split(2)), LAYERS, tmp_path / "a.h5",
                         chunks=False)
    with pytest.raises(InvalidOptionError, match="chunks must be .* got 0"):
        torchlog.extract(Net(), torch.randn(4, 3), LAYERS, tmp_path / "a.h5", batch_size=2, chunks=0)
    assert not (tmp_path / "a.h5").exists()


def test_a_layer_whose_dtype_changes_is_refused(tmp_path: Path) -> None:
    batches = [torch.randn(2, 3), torch.randn(2, 3).double()]
    with pytest.raises(LogFileError, match="layer 'relu_1_1' gave float64 values in batch 1, but float32"):
        torchlog.extract(nn.ReLU(), batches, ["relu"], tmp_path / "a.h5")


def test_a_rerun_with_another_batch_size_or_dataset_length_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "acts.h5"
    torchlog.extract(Net(), torch.randn(12, 3), LAYERS, path, batch_size=4)
    before = path.read_bytes()
    with pytest.raises(LogFileExistsError, match="it holds an extract with batch_size '4', not '5'"):
        torchlog.extract(Net(), torch.randn(12, 3), LAYERS, path, batch_size=5)
    with pytest.raises(LogFileExistsError, match="the number of samples '12', not '16'"):
        torchlog.extract(Net(), torch.randn(16, 3), LAYERS, path, batch_size=4)
    assert path.read_bytes() == before


def test_a_selector_chooses_layers_and_opens_them_by_its_text(tmp_path: Path) -> None:
    from torchlog import select
    from torchlog.storage import ActivationDataset

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    data = torch.randn(20, 4)
    path = tmp_path / "selected.h5"
    torchlog.extract(net, data, layers=[select.func("relu") | select.module("2")], to=str(path), batch_size=8,
                     progress=False)
    with torch.no_grad():
        relu, last = torch.relu(net[0](data)), net(data)
    key = "func('relu') | module('2')"
    rows = ActivationDataset(str(path), layers=[key])
    assert len(rows) == 20
    with h5py.File(path) as file:  # the selection is stored as text and labels, never as code
        assert key in file["layers"].attrs["selected"]
    acts = open_activations(str(path))
    assert torch.allclose(torch.as_tensor(acts["relu_1_2"][:]), relu, atol=1e-6)
    assert torch.allclose(torch.as_tensor(acts["linear_2_3"][:]), last, atol=1e-6)
