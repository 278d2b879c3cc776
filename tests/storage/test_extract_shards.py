"""Tests of storage/shards.py, distributed.py and extract_files.py: ranks simulated by threads
sharing an in-process store (torchrun runs them for real in test_extract_distributed.py)."""
from __future__ import annotations

import importlib
import os
import threading
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import torchlog
from tests.storage import extract_factories as factories
from torchlog.errors import DistributedExtractError, InvalidOptionError, LogFileError, LogFileExistsError
from torchlog.storage import open_activations
from torchlog.storage.distributed import Group
from torchlog.storage.shards import find_shards, shard_path

LAYERS = factories.LAYERS
extract_module = importlib.import_module("torchlog.storage.extraction")  # the package shows the function


def _ranks(monkeypatch: pytest.MonkeyPatch, world: int, call) -> dict[int, object]:
    """Run `call(rank)` in one thread per rank, each seeing its own Group; the results or errors."""
    store = torch.distributed.HashStore()
    groups: dict[int, Group] = {}
    results: dict[int, object] = {}
    monkeypatch.setattr(extract_module, "current_group", lambda: groups.get(threading.get_ident(), Group()))

    def run(rank: int) -> None:
        groups[threading.get_ident()] = Group(rank, world, store, "test")
        try:
            results[rank] = call(rank)
        except Exception as exc:  # handed to the test, which checks it
            results[rank] = exc

    threads = [threading.Thread(target=run, args=(rank,), daemon=True) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)  # a safety net: a correct run ends in about a second
    assert not any(t.is_alive() for t in threads), "a rank is still waiting"
    return results


def _extract(path: Path, model=factories.model, **kwargs):
    return lambda rank: torchlog.extract(model(), factories.data(), LAYERS, path,
                                         batch_size=factories.BATCH_SIZE, **kwargs)


def _reference(path: Path) -> dict[str, np.ndarray]:
    acts = torchlog.extract(factories.model(), factories.data(), LAYERS, path,
                            batch_size=factories.BATCH_SIZE)
    return {label: acts[label] for label in acts}


@pytest.mark.parametrize("world", [2, 3, 5])
def test_the_joined_file_equals_a_single_process_run(tmp_path: Path, monkeypatch, world: int) -> None:
    expected = _reference(tmp_path / "single.h5")
    target = tmp_path / "acts.h5"
    results = _ranks(monkeypatch, world, _extract(target))
    assert all(repr(r) == repr(results[0]) for r in results.values()), results  # all return the join
    acts = open_activations(target)
    assert acts.is_complete and acts.num_samples == factories.NUM_SAMPLES
    for label in LAYERS:
        np.testing.assert_array_equal(acts[label], expected[label])
    assert acts.selected == open_activations(tmp_path / "single.h5").selected == {k: [k] for k in LAYERS}
    assert sorted(find_shards(target).values()) == [(r, world) for r in range(world)]
    with h5py.File(target) as file:  # plain h5py reads one array per layer, sample i at row i
        assert file["layers/relu_1_2"].is_virtual
        np.testing.assert_array_equal(file["layers/linear_2_3"][()], expected["linear_2_3"])
        assert file["batch_sizes"][()].sum() == factories.NUM_SAMPLES


def test_more_ranks_than_batches_leave_empty_shards(tmp_path: Path, monkeypatch) -> None:
    data = torch.randn(6, 8)
    target = tmp_path / "acts.h5"
    _ranks(monkeypatch, 4, lambda rank: torchlog.extract(factories.model(), data, LAYERS, target,
                                                         batch_size=3))
    expected = torchlog.extract(factories.model(), data, LAYERS, tmp_path / "one.h5", batch_size=3)
    np.testing.assert_array_equal(open_activations(target)["relu_1_2"], expected["relu_1_2"])
    # Rank 0 had no batch: the entries come from a shard that had one.
    assert open_activations(target).selected == {"relu_1_2": ["relu_1_2"], "linear_2_3": ["linear_2_3"]}


def _bytes(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


def test_a_changed_world_size_is_refused_before_anything_is_written(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "acts.h5"
    _ranks(monkeypatch, 2, _extract(target))
    before = _bytes(tmp_path)
    results = _ranks(monkeypatch, 3, _extract(target))
    messages = {rank: str(error) for rank, error in results.items()}
    assert "come from a run with world size 2, and this run has world size 3" in messages[0]
    assert isinstance(results[0], LogFileExistsError)
    assert _bytes(tmp_path) == before
    with pytest.raises(LogFileExistsError, match="world size 2, and this run has world size 1"):
        _extract(target)(0)
    assert _bytes(tmp_path) == before
    _ranks(monkeypatch, 3, _extract(target, overwrite=True))  # starting over is allowed
    assert sorted(find_shards(target).values()) == [(0, 3), (1, 3), (2, 3)]


def test_shards_of_another_model_or_layer_list_are_refused_on_every_rank(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "acts.h5"
    _ranks(monkeypatch, 2, _extract(target))
    os.remove(target)  # as if the run had stopped before joining
    before = _bytes(tmp_path)

    def other_layers(rank: int):
        return torchlog.extract(factories.model(), factories.data(), ["relu_1_2"], target,
                                batch_size=factories.BATCH_SIZE)

    results = _ranks(monkeypatch, 2, other_layers)
    assert isinstance(results[0], LogFileExistsError) and isinstance(results[1], LogFileExistsError)
    assert "it holds an extract with layers" in str(results[1]) and "shard1-of-2" in str(results[1])
    assert _bytes(tmp_path) == before


def test_an_entry_that_selects_nothing_stops_every_rank_before_writing(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "acts.h5"
    results = _ranks(monkeypatch, 2, lambda rank: torchlog.extract(
        factories.model(), factories.data(), ["relu_1_2", "conv2d"], target, batch_size=4))
    assert isinstance(results[0], InvalidOptionError) and "'conv2d' matches no layer" in str(results[0])
    assert os.listdir(tmp_path) == []


def test_a_rank_with_a_problem_names_itself_to_the_others(tmp_path: Path, monkeypatch) -> None:
    def second_rank_breaks(rank: int):
        model = factories.model()
        if rank == 1:
            model.fc1 = torch.nn.Linear(5, 16)  # a model that cannot take the samples
        return torchlog.extract(model, factories.data(), LAYERS, tmp_path / "acts.h5", batch_size=4)

    results = _ranks(monkeypatch, 2, second_rank_breaks)
    assert isinstance(results[1], RuntimeError) and "mat1 and mat2" in str(results[1])
    assert isinstance(results[0], DistributedExtractError)
    assert str(results[0]).startswith("rank 1 of 2 cannot start the extract, so no rank wrote anything: RuntimeError")
    assert os.listdir(tmp_path) == []


def test_a_joined_file_whose_shard_is_missing_is_refused(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "acts.h5"
    _ranks(monkeypatch, 2, _extract(target))
    os.rename(shard_path(str(target), 1, 2), tmp_path / "elsewhere.h5")
    with pytest.raises(LogFileError, match=r"reads from the shard 'acts.shard1-of-2.h5', which is not in"):
        open_activations(target)


def test_samples_of_another_shape_are_named(tmp_path: Path) -> None:
    samples = [torch.randn(3, 4) for _ in range(5)] + [torch.randn(3, 5)]
    with pytest.raises(InvalidOptionError, match=r"sample 5 has shape \(3, 5\), but sample 0 has \(3, 4\)"):
        torchlog.extract(torch.nn.ReLU(), samples, ["relu"], tmp_path / "a.h5", batch_size=2)


def test_rank_0_alone_shows_the_global_count(tmp_path: Path, monkeypatch, capsys) -> None:
    _ranks(monkeypatch, 2, _extract(tmp_path / "acts.h5", progress=True))
    shown = capsys.readouterr().err
    total = factories.NUM_SAMPLES // factories.BATCH_SIZE
    assert f"{total}/{total}" in shown and shown.count("extract:") >= 1
    assert f"/{total // 2} " not in shown  # no bar of one rank's own share
