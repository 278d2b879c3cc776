"""`torchrun --nproc_per_node=2 -m torchlog extract` with gloo on CPU: the joined file equals a
single-process run, also after a rank was killed with SIGKILL and the command rerun.

Ranks stop at known batches through the hooks of tests/storage/extract_factories.py, so the
shards a killed run leaves are always the same.
"""
from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

import torchlog
from tests.storage import extract_factories as factories
from torchlog.errors import OpSequenceChangedWarning
from torchlog.storage import open_activations
from torchlog.storage.shards import shard_path

ROOT = Path(__file__).resolve().parents[2]
FACTORIES = "tests.storage.extract_factories"


def _torchrun(target: Path, model: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            "-m", "torchlog", "extract", "--model", f"{FACTORIES}:{model}",
            "--data", f"{FACTORIES}:data", "--layers", *factories.LAYERS,
            "--batch-size", str(factories.BATCH_SIZE), "--to", str(target), "--no-progress"]
    return subprocess.run(argv, cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True,
                          text=True, timeout=300)


def _single_process(model: torch.nn.Module, path: Path) -> dict[str, np.ndarray]:
    """The same extract in this process, with one thread like each torchrun rank."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        acts = torchlog.extract(model, factories.data(), factories.LAYERS, path,
                                batch_size=factories.BATCH_SIZE)
    finally:
        torch.set_num_threads(threads)
    return {label: acts[label] for label in acts}


def _assert_same(path: Path, expected: dict[str, np.ndarray]) -> None:
    acts = open_activations(path)
    assert acts.is_complete and list(acts) == list(expected)
    for label, array in expected.items():
        got = acts[label]
        assert got.dtype == array.dtype and got.tobytes() == array.tobytes(), label  # bit for bit


def test_two_ranks_write_the_single_process_file_with_a_batch_running_other_ops_after_the_layers(
        tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", OpSequenceChangedWarning)  # the saved ops run as in the first batch
        expected = _single_process(factories.changing_model(), tmp_path / "single.h5")
    done = _torchrun(tmp_path / "acts.h5", "changing_model")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "OpSequenceChangedWarning" not in done.stderr
    assert "wrote <ActivationFile" in done.stdout
    _assert_same(tmp_path / "acts.h5", expected)


def test_a_rank_killed_with_sigkill_finishes_on_rerun_with_the_same_arrays(tmp_path: Path) -> None:
    target = tmp_path / "acts.h5"
    # Rank 0 (batches 0-5) dies about to load batch 3, once rank 1 (6-11) is parked before 9.
    stops = {"TORCHLOG_TEST_KILL": f"0:3:{tmp_path}", "TORCHLOG_TEST_PARK": f"1:9:{tmp_path}"}
    killed = _torchrun(target, "model", stops)
    assert killed.returncode != 0 and not target.exists()
    assert "SIGKILL" in killed.stderr, killed.stderr[-3000:]
    for rank in (0, 1):
        shard = open_activations(shard_path(str(target), rank, 2))
        assert not shard.is_complete and shard.num_samples == 3 * factories.BATCH_SIZE
    done = _torchrun(target, "model")
    assert done.returncode == 0, done.stderr[-3000:]
    _assert_same(target, _single_process(factories.model(), tmp_path / "single.h5"))
