"""Tests of storage/reader.py: loaded histories behave exactly like the ones saved; bad files."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import torchlog
from tests.models import TINY_MODELS, ModuleOutputs, StructuredIO
from tests.storage.compare import assert_same_history
from torchlog.demo import DemoNet
from torchlog.errors import IncompleteLogWarning, LayerNotFoundError, LogFileError, LogFileNotFoundError
from torchlog.storage.lazy import StoredTensor

ROOT = Path(__file__).resolve().parents[2]
CASES = {name: (make, inputs) for name, (make, inputs) in TINY_MODELS.items()}
CASES["demo"] = (lambda: DemoNet().eval(), lambda: torch.rand(1, 3, 16, 16))
CASES["module_outputs"] = (ModuleOutputs, lambda: torch.rand(2, 3))
CASES["structured_io"] = (StructuredIO, lambda: [{"a": torch.rand(2, 3), "nested": [torch.rand(2, 3)]},
                                                 [torch.rand(2, 3), torch.rand(2, 3)]])


@pytest.fixture(scope="module")
def saved_logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    """Each case logged once in memory (then saved) and once streamed."""
    folder = tmp_path_factory.mktemp("logs")
    out = {}
    for name, (make, inputs) in CASES.items():
        torch.manual_seed(0)
        model, x = make(), inputs()
        in_memory = torchlog.log_forward_pass(model, x, random_seed=0)
        in_memory.save(folder / f"{name}.saved.h5")
        streamed = torchlog.log_forward_pass(model, x, random_seed=0, save_to=folder / f"{name}.streamed.h5")
        out[name] = (in_memory, streamed, folder / f"{name}.saved.h5", folder / f"{name}.streamed.h5")
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_saved_history_loads_exactly_as_it_was(saved_logs: dict, name: str) -> None:
    in_memory, _, saved, _ = saved_logs[name]
    loaded = torchlog.load(saved)
    assert_same_history(in_memory, loaded)
    torchlog.lint(loaded, complete=True)
    assert all(isinstance(p.saved, StoredTensor) for p in loaded if p.saved is not None)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_streamed_log_loads_exactly_as_log_forward_pass_returned_it(saved_logs: dict, name: str) -> None:
    in_memory, streamed, _, path = saved_logs[name]
    loaded = torchlog.load(path)
    torchlog.lint(loaded, complete=True)
    assert_same_history(streamed, loaded)
    assert_same_history(in_memory, loaded, same_run=False)


@pytest.mark.parametrize("name", ["demo", "simple_recurrent", "nested"])
def test_a_loaded_history_renders_the_same_graph(saved_logs: dict, name: str) -> None:
    in_memory, _, saved, _ = saved_logs[name]
    loaded = torchlog.load(saved)
    torchlog.lint(loaded)
    for mode in ("unrolled", "rolled"):
        assert in_memory.to_dot(mode=mode) == loaded.to_dot(mode=mode)


def test_a_failed_lookup_names_the_file(saved_logs: dict) -> None:
    _, _, saved, _ = saved_logs["demo"]
    with pytest.raises(LayerNotFoundError, match=r"no layer matches 'conv9'.*in log file '.*demo.saved.h5'"):
        torchlog.load(saved)["conv9"]


_LAZY_SCRIPT = textwrap.dedent("""
    import resource, sys, time, torchlog
    def read_bytes() -> int:  # bytes this process read from files, page cache or not
        return int(next(l for l in open("/proc/self/io") if l.startswith("rchar")).split()[1])
    before, started = read_bytes(), time.perf_counter()
    history = torchlog.load(sys.argv[1])
    print("read", read_bytes() - before, "in", time.perf_counter() - started)
    before = read_bytes()
    x = history[-2].tensor_contents
    print("one", read_bytes() - before, x.numel() * 4)
""")


def test_opening_a_big_log_reads_only_its_records(tmp_path: Path) -> None:
    class Big(torch.nn.Module):
        def forward(self, x):
            for _ in range(50):
                x = x + 1
            return x

    path = tmp_path / "big.h5"
    torchlog.log_forward_pass(Big(), torch.zeros(1 << 18), save_to=path)  # 51 x 1 MB
    done = subprocess.run([sys.executable, "-c", _LAZY_SCRIPT, str(path)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    opened = int(done.stdout.split("read ")[1].split()[0])
    one, size = (int(v) for v in done.stdout.split("one ")[1].split()[:2])
    assert opened < os.path.getsize(path) / 100, done.stdout  # records only, no tensor data
    assert size <= one < 2 * size, done.stdout  # one access reads that activation, once


# ----- bad files ------------------------------------------------------------------------------------
def test_a_missing_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(LogFileNotFoundError, match="'.*nothing.h5' does not exist"):
        torchlog.load(tmp_path / "nothing.h5")


def test_a_file_that_is_not_hdf5_is_reported(tmp_path: Path) -> None:
    (tmp_path / "run.h5").write_bytes(os.urandom(4096))
    with pytest.raises(LogFileError, match="run.h5.*not an HDF5 file"):
        torchlog.load(tmp_path / "run.h5")


def test_a_foreign_hdf5_file_is_reported(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "other.h5", "w") as file:
        file["data"] = np.ones(3)
    with pytest.raises(LogFileError, match="other.h5' is an HDF5 file but not a torchlog log"):
        torchlog.load(tmp_path / "other.h5")


def test_a_truncated_file_is_reported(saved_logs: dict, tmp_path: Path) -> None:
    _, _, saved, _ = saved_logs["demo"]
    data = saved.read_bytes()
    (tmp_path / "cut.h5").write_bytes(data[: len(data) // 2])
    with pytest.raises(LogFileError, match="cut.h5.*truncated"):
        torchlog.load(tmp_path / "cut.h5")


def test_a_newer_format_version_names_both_versions(saved_logs: dict, tmp_path: Path) -> None:
    shutil.copy(saved_logs["demo"][2], tmp_path / "new.h5")
    with h5py.File(tmp_path / "new.h5", "r+") as file:
        file.attrs["format_version"] = 7
    with pytest.raises(LogFileError, match="format version 7, but this torchlog reads versions up to 1"):
        torchlog.load(tmp_path / "new.h5")


def test_damaged_records_are_reported(saved_logs: dict, tmp_path: Path) -> None:
    shutil.copy(saved_logs["demo"][2], tmp_path / "bad.h5")
    with h5py.File(tmp_path / "bad.h5", "r+") as file:
        del file["metadata"]
        file.create_dataset("metadata", data='{"passes": [{"label": 3}]}', dtype=h5py.string_dtype())
    with pytest.raises(LogFileError, match="bad.h5' is damaged"):
        torchlog.load(tmp_path / "bad.h5")


def test_reading_after_the_file_was_replaced_is_reported(saved_logs: dict, tmp_path: Path) -> None:
    shutil.copy(saved_logs["demo"][2], tmp_path / "run.h5")
    loaded = torchlog.load(tmp_path / "run.h5")
    torchlog.lint(loaded)
    shutil.copy(saved_logs["simple_recurrent"][2], tmp_path / "run.h5")
    with pytest.raises(LogFileError, match="run.h5' is not the log this history was read from.*replaced"):
        loaded["batchnorm_1_4"].tensor_contents


def test_a_save_cut_short_after_its_records_opens_with_the_values_it_has(
        saved_logs: dict, tmp_path: Path) -> None:
    in_memory, _, saved, _ = saved_logs["simple_recurrent"]
    shutil.copy(saved, tmp_path / "cut.h5")
    with h5py.File(tmp_path / "cut.h5", "r+") as file:  # as if history.save() died after 5 values
        for name in list(file["activations"])[5:]:
            del file["activations"][name]
        file.attrs["status"] = "writing"
    with pytest.warns(IncompleteLogWarning, match="cut.h5' is incomplete"):
        loaded = torchlog.load(tmp_path / "cut.h5")
    torchlog.lint(loaded)
    assert loaded.is_partial and loaded.layer_labels == in_memory.layer_labels
    assert len({p.saved.name for p in loaded if p.saved is not None}) == 5  # the output shares one
    for record in loaded:
        if record.saved is not None:
            assert torch.equal(record.tensor_contents, in_memory[record.label].tensor_contents)


def test_the_storage_package_never_uses_pickle() -> None:
    for source in (ROOT / "storage").glob("*.py"):
        text = source.read_text()
        assert "pickle" not in text and "eval(" not in text, source
