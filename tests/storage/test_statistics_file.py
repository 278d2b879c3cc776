"""Tests of storage/statistics_file.py: Statistics.save and Statistics.load round trip, and bad files."""
from __future__ import annotations

import os
from pathlib import Path

import h5py
import pytest
import torch
from torch import nn

import torchlog
from torchlog.datasets import Statistics, covariance, histogram, keep, quantiles, statistics
from torchlog.errors import LogFileError, LogFileExistsError, LogFileNotFoundError


def _found() -> Statistics:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    data = torch.randn(90, 4)
    wanted = ["mean", "std", "min", "max", "zeros", "norm", histogram(-1, 1, 5), covariance(2), quantiles([0.1, 0.5])]
    return statistics(model, data, ["0", "relu_1_2", torchlog.select.func("relu")], stats=wanted,
                      cka=[("0", "relu_1_2")], batch_size=32, progress=False)


def test_a_saved_result_loads_with_every_value_equal(tmp_path: Path) -> None:
    found = _found()
    path = found.save(tmp_path / "stats.h5")
    loaded = Statistics.load(path)
    selector = torchlog.select.func("relu")
    assert list(loaded) == ["0", "relu_1_2", repr(selector)]  # a selector comes back as its text
    for site, saved in zip(loaded, found):
        before, after = found[saved], loaded[site]
        assert (after.count, after.shape, after.kept, after.ndim, after.dtype, after.device) == (
            before.count, before.shape, before.kept, before.ndim, before.dtype, before.device)
        assert after.names == before.names
        for name in before.names:
            assert getattr(after, name).dtype == getattr(before, name).dtype, name
            assert torch.equal(getattr(after, name), getattr(before, name)), name  # stored exactly
    assert loaded.cka == found.cka and len(found.cka) == 1


def test_a_loaded_result_feeds_interventions_as_the_original_does(tmp_path: Path) -> None:
    found = _found()
    loaded = Statistics.load(found.save(tmp_path / "stats.h5"))
    x = torch.randn(2, 4)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    for action in ("mean_ablate", "project_out"):
        ours = torchlog.run(model, x, intervene={"0": getattr(loaded, action)("0")}).output
        theirs = torchlog.run(model, x, intervene={"0": getattr(found, action)("0")}).output
        assert torch.equal(ours, theirs), action


def test_an_existing_file_is_kept_unless_overwrite(tmp_path: Path) -> None:
    found = _found()
    path = tmp_path / "stats.h5"
    path.write_bytes(b"mine")
    with pytest.raises(LogFileExistsError, match="already exists; pass overwrite=True"):
        found.save(path)
    assert path.read_bytes() == b"mine"
    found.save(path, overwrite=True)
    assert list(Statistics.load(path)) == [str(site) if not isinstance(site, str) else site for site in found]


def test_a_failed_write_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = _found()
    from torchlog.storage import statistics_file

    def broken(group, site) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(statistics_file, "_write_site", broken)
    with pytest.raises(OSError, match="disk full"):
        found.save(tmp_path / "stats.h5")
    assert os.listdir(tmp_path) == []


def test_other_files_are_refused_naming_what_they_are(tmp_path: Path) -> None:
    with pytest.raises(LogFileNotFoundError, match="does not exist"):
        Statistics.load(tmp_path / "missing.h5")
    acts = tmp_path / "acts.h5"
    torchlog.extract(nn.ReLU(), torch.rand(4, 2), ["relu_1_1"], acts, batch_size=2, progress=False)
    with pytest.raises(LogFileError, match="is a 'torchlog-extract' file, not a 'torchlog-statistics' file; "
                                           r"open it with torchlog.storage.open_activations\(path\)"):
        Statistics.load(acts)
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as file:
        file.attrs["format"] = "something"
    with pytest.raises(LogFileError, match="not a torchlog log"):
        Statistics.load(other)


def test_a_cnn_result_keeps_its_kept_dimension(tmp_path: Path) -> None:
    torch.manual_seed(2)
    conv = nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU())
    found = statistics(conv, torch.randn(12, 1, 6, 6), ["1"], stats=["mean", "zeros"], reduce=keep(1),
                       batch_size=5, progress=False)
    loaded = Statistics.load(found.save(tmp_path / "cnn.h5"))
    assert loaded["1"].kept == (1,) and loaded["1"].shape == (3,)
    assert torch.equal(loaded["1"].mean, found["1"].mean)


def test_learned_histogram_edges_per_feature_round_trip(tmp_path: Path) -> None:
    torch.manual_seed(1)
    found = statistics(nn.Sequential(nn.Linear(3, 4)), torch.randn(50, 3), ["0"], stats=[histogram(num_bins=6)],
                       batch_size=16, progress=False)
    loaded = Statistics.load(found.save(tmp_path / "stats.h5"))
    assert loaded["0"].histogram_edges.shape == (4, 7)
    for name in ("histogram", "histogram_edges", "below", "above"):
        assert torch.equal(loaded["0"].values[name], found["0"].values[name]), name


def test_a_checkpoint_keeps_every_tensor_exactly_and_a_failed_write_keeps_the_last(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchlog.storage import statistics_file

    path = tmp_path / "state.h5"
    tensors = {"site0.moments.mean": torch.randn(3, dtype=torch.float64), "site0.moments.count": torch.tensor(7),
               "site0.quantiles.level.0": torch.empty(3, 0, dtype=torch.float64),
               "site0.quantiles.odd": torch.tensor([True, False])}
    statistics_file.write_checkpoint(path, {"done": 4, "sites": ["'0'"]}, tensors)
    meta, back = statistics_file.read_checkpoint(path)
    assert meta == {"done": 4, "sites": ["'0'"]} and list(back) == sorted(tensors)
    for name, value in tensors.items():
        assert back[name].dtype == value.dtype and torch.equal(back[name], value), name

    def broken(*args, **kwargs) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(statistics_file.files, "create", broken)
    with pytest.raises(OSError, match="disk full"):
        statistics_file.write_checkpoint(path, {"done": 6}, tensors)
    assert statistics_file.read_checkpoint(path)[0]["done"] == 4 and os.listdir(tmp_path) == ["state.h5"]
    monkeypatch.undo()
    found = _found().save(tmp_path / "stats.h5")
    with pytest.raises(LogFileError, match="is a 'torchlog-statistics' file, not a 'torchlog-statistics-checkpoint'"):
        statistics_file.read_checkpoint(found)
