"""Tests of storage/writer.py and the save_to wiring of log_forward_pass."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from torch import nn

import torchlog
from tests.models import SimpleRecurrent
from tests.storage.compare import assert_same_history, same_value
from tests.storage.memory_scripts import DEEP_MODEL
from torchlog.errors import (
    IncompleteLogWarning,
    InvalidArgumentTypeError,
    InvalidOptionError,
    LogFileError,
    LogFileExistsError,
    LogFileNotFoundError,
    LogFilePermissionError,
)
from torchlog.storage.lazy import StoredTensor

ROOT = Path(__file__).resolve().parents[2]


class Counting(nn.Module):
    """Counts its forward calls, to prove checks happen before the model runs."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return torch.relu(self.lin(x))


class FailsHalfway(nn.Module):
    """Runs a few ops, then raises."""

    def forward(self, x):
        y = torch.sin(x) * 2
        z = y.exp()
        raise ValueError(f"bad batch of shape {tuple(z.shape)}")


class AllDtypes(nn.Module):
    """Produces tensors of many dtypes, 0-d and empty ones included."""

    def forward(self, x):
        outs = [x.to(d) for d in (torch.bfloat16, torch.float16, torch.float64, torch.int8,
                                  torch.uint8, torch.int16, torch.int32, torch.int64)]
        return (*outs, x > 0, torch.complex(x, -x), x.sum(), x[:0], torch.view_as_real(torch.complex(x, x)))


def test_streamed_history_holds_stored_tensors_that_read_like_the_in_memory_ones(tmp_path: Path) -> None:
    model, x = SimpleRecurrent(), torch.rand(6, 5)
    in_memory = torchlog.log_forward_pass(model, x, random_seed=1)
    streamed = torchlog.log_forward_pass(model, x, random_seed=1, save_to=tmp_path / "run.h5")
    assert all(isinstance(p.saved, StoredTensor) for p in streamed)
    assert_same_history(in_memory, streamed, same_run=False)
    with h5py.File(tmp_path / "run.h5") as file:
        assert file.attrs["status"] == "complete"
        assert file.attrs["format"] == "torchlog" and file.attrs["format_version"] == 1


def test_every_dtype_streams_and_reads_back_exactly(tmp_path: Path) -> None:
    x = torch.randn(3, 4) * 100
    in_memory = torchlog.log_forward_pass(AllDtypes(), x, random_seed=0)
    torchlog.log_forward_pass(AllDtypes(), x, random_seed=0, save_to=tmp_path / "run.h5")
    loaded = torchlog.load(tmp_path / "run.h5")
    torchlog.lint(loaded, complete=True)
    assert_same_history(in_memory, loaded, same_run=False)
    dtypes = {p.tensor_contents.dtype for p in loaded}
    assert {torch.bfloat16, torch.float16, torch.bool, torch.complex64, torch.uint8} <= dtypes
    assert any(p.shape == () for p in loaded) and any(0 in p.shape for p in loaded)


def test_plain_h5py_finds_activations_by_label(tmp_path: Path) -> None:
    history = torchlog.log_forward_pass(Counting(), torch.rand(2, 3), save_to=tmp_path / "run.h5")
    with h5py.File(tmp_path / "run.h5", "r") as file:
        for record in history:
            assert np.array_equal(file["by_label"][record.label][()], record.tensor_contents.numpy())


@pytest.mark.parametrize("keep_unsaved", [False, True])
def test_chosen_layers_stream_and_the_pruned_history_round_trips(tmp_path: Path, keep_unsaved: bool) -> None:
    model, x = SimpleRecurrent(), torch.rand(2, 5)
    options = dict(layers_to_save=["linear_1_1:2", "mul"], keep_unsaved_layers=keep_unsaved, random_seed=3)
    in_memory = torchlog.log_forward_pass(model, x, **options)
    streamed = torchlog.log_forward_pass(model, x, save_to=tmp_path / "run.h5", **options)
    with h5py.File(tmp_path / "run.h5", "r") as file:
        # An output shares its producer's value when both are saved: one dataset each value.
        assert len(file["activations"]) == len({id(p.saved) for p in in_memory if p.saved is not None})
        assert set(file["by_label"]) == {p.label for p in in_memory if p.saved is not None}
    assert_same_history(in_memory, streamed, same_run=False)
    loaded = torchlog.load(tmp_path / "run.h5")
    torchlog.lint(loaded, complete=keep_unsaved)
    assert_same_history(streamed, loaded)


def test_postfunc_results_that_are_not_tensors_are_stored(tmp_path: Path) -> None:
    def summary(t: torch.Tensor):
        return {"mean": t.float().mean().item(), "shape": tuple(t.shape), "head": t.flatten()[:2]}

    model, x = Counting(), torch.rand(2, 3)
    in_memory = torchlog.log_forward_pass(model, x, activation_postfunc=summary)
    torchlog.log_forward_pass(model, x, activation_postfunc=summary, save_to=tmp_path / "run.h5")
    loaded = torchlog.load(tmp_path / "run.h5")
    torchlog.lint(loaded, check_saved=False)
    for a, b in zip(in_memory, loaded):
        assert same_value(a.tensor_contents, b.tensor_contents)
    assert isinstance(loaded["relu_1_2"].tensor_contents["shape"], tuple)


@pytest.mark.parametrize("on_error", ["raise", "return"])
def test_postfunc_results_that_cannot_be_stored_raise_and_leave_an_incomplete_file(
        tmp_path: Path, on_error: str) -> None:
    with pytest.raises(InvalidArgumentTypeError, match="activation of op #0.*set"):
        torchlog.log_forward_pass(Counting(), torch.rand(2, 3), activation_postfunc=lambda t: {1, 2},
                                  save_to=tmp_path / "run.h5", on_error=on_error)
    with pytest.warns(IncompleteLogWarning, match="incomplete: .*cannot be written to an HDF5 log"):
        assert torchlog.load(tmp_path / "run.h5").is_partial


@pytest.mark.parametrize("on_error", ["raise", "return"])
def test_a_model_that_raises_leaves_a_readable_incomplete_file(tmp_path: Path, on_error: str) -> None:
    path = tmp_path / "run.h5"
    x = torch.rand(2, 3)
    if on_error == "raise":
        with pytest.raises(ValueError, match="bad batch") as info:
            torchlog.log_forward_pass(FailsHalfway(), x, save_to=path, random_seed=0)
        partial = info.value.torchlog_history
    else:
        partial = torchlog.log_forward_pass(FailsHalfway(), x, save_to=path, on_error="return", random_seed=0)
    with h5py.File(path, "r") as file:
        assert file.attrs["status"] == "incomplete"
        assert "ValueError" in file.attrs["failure"]
    with pytest.warns(IncompleteLogWarning, match="incomplete: .*ValueError"):
        loaded = torchlog.load(path)
    torchlog.lint(loaded)
    assert loaded.is_partial and loaded.layer_labels == partial.layer_labels == ["input_1_0", "sin_1_1", "mul_1_2", "exp_1_3"]
    assert_same_history(partial, loaded)
    assert torch.equal(loaded["exp_1_3"].tensor_contents, (torch.sin(x) * 2).exp())


def test_history_save_writes_an_in_memory_history_with_compression(tmp_path: Path) -> None:
    history = torchlog.log_forward_pass(SimpleRecurrent(), torch.zeros(64, 5))
    assert history.save(tmp_path / "run.h5", compression="gzip", compression_opts=4) == str(tmp_path / "run.h5")
    with h5py.File(tmp_path / "run.h5", "r") as file:
        assert file["activations/0"].compression == "gzip"
    loaded = torchlog.load(tmp_path / "run.h5")
    torchlog.lint(loaded, complete=True)
    assert_same_history(history, loaded)


def test_gradients_and_rng_states_round_trip_as_tensors(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5), nn.ReLU()).train()
    history = torchlog.log_forward_pass(model, torch.rand(2, 3, requires_grad=True), save_gradients=True,
                                        save_function_args=True)
    history.log_backward(history[-1].tensor_contents.sum())
    history.save(tmp_path / "run.h5")
    loaded = torchlog.load(tmp_path / "run.h5")
    torchlog.lint(loaded, complete=True)
    assert loaded.layers_with_grads == history.layers_with_grads != []
    assert isinstance(loaded["dropout_1_2"].rng_state, torch.Tensor)
    assert_same_history(history, loaded)  # grad_contents and rng_state compared bit for bit


def test_a_loaded_history_saves_to_a_new_file(tmp_path: Path) -> None:
    history = torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5), save_to=tmp_path / "a.h5")
    torchlog.load(tmp_path / "a.h5").save(tmp_path / "b.h5")
    os.remove(tmp_path / "a.h5")  # b must hold its own copies
    history_b = torchlog.load(tmp_path / "b.h5")
    torchlog.lint(history_b, complete=True)
    assert history_b.layer_labels == history.layer_labels
    assert torch.equal(history_b["linear_1_1:3"].tensor_contents, history_b[7].tensor_contents)


# ----- bad paths -------------------------------------------------------------------------------------
def test_a_missing_folder_is_refused_before_the_model_runs(tmp_path: Path) -> None:
    model = Counting()
    with pytest.raises(LogFileNotFoundError, match="folder .*missing.* does not exist"):
        torchlog.log_forward_pass(model, torch.rand(2, 3), save_to=tmp_path / "missing" / "run.h5")
    assert model.calls == 0


def test_an_existing_file_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "run.h5"
    path.write_bytes(b"precious data")
    model = Counting()
    with pytest.raises(LogFileExistsError, match="run.h5.*already exists.*overwrite=True"):
        torchlog.log_forward_pass(model, torch.rand(2, 3), save_to=path)
    assert path.read_bytes() == b"precious data" and model.calls == 0
    torchlog.log_forward_pass(model, torch.rand(2, 3), save_to=path, overwrite=True)
    assert torchlog.load(path).layer_labels[-1] == "output_1_3"


def test_a_folder_as_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LogFileError, match="is a folder"):
        torchlog.log_forward_pass(Counting(), torch.rand(2, 3), save_to=tmp_path)


def test_bad_arguments_leave_no_file_behind(tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match="nonexistent"):
        torchlog.log_forward_pass(Counting(), torch.rand(2, 3), layers_to_save=["nonexistent"],
                                  save_to=tmp_path / "run.h5")
    assert not (tmp_path / "run.h5").exists()
    with pytest.raises(InvalidArgumentTypeError, match="overwrite"):
        torchlog.log_forward_pass(Counting(), torch.rand(2, 3), save_to=tmp_path / "run.h5", overwrite="yes")
    with pytest.raises(InvalidArgumentTypeError, match="save path"):
        torchlog.log_forward_pass(Counting(), torch.rand(2, 3), save_to=42)


def test_overwriting_the_file_a_history_reads_from_is_refused(tmp_path: Path) -> None:
    torchlog.log_forward_pass(Counting(), torch.rand(2, 3), save_to=tmp_path / "run.h5")
    loaded = torchlog.load(tmp_path / "run.h5")
    before = (tmp_path / "run.h5").read_bytes()
    with pytest.raises(LogFileError, match="reads its tensors from it"):
        loaded.save(tmp_path / "run.h5", overwrite=True)
    assert (tmp_path / "run.h5").read_bytes() == before


_UNWRITABLE = """
import os, sys, torch, torchlog
os.setuid(65534)  # nobody: root would pass any permission check
try:
    torchlog.log_forward_pass(torch.nn.ReLU(), torch.ones(2), save_to=sys.argv[1])
except torchlog.errors.LogFilePermissionError as exc:
    print("refused:", exc)
"""


def test_an_unwritable_folder_is_refused() -> None:
    outer = Path(tempfile.mkdtemp())  # tmp_path's parents are private to root: not reachable as nobody
    try:
        outer.chmod(0o755)
        folder = outer / "locked"
        folder.mkdir()
        folder.chmod(0o555)
        target = str(folder / "run.h5")
        if os.geteuid() != 0:
            with pytest.raises(LogFilePermissionError, match="locked.* is not writable"):
                torchlog.log_forward_pass(torch.nn.ReLU(), torch.ones(2), save_to=target)
        else:
            done = subprocess.run([sys.executable, "-c", _UNWRITABLE, target], capture_output=True,
                                  text=True, cwd=ROOT, timeout=120)
            assert "refused:" in done.stdout and "locked' is not writable" in done.stdout, done.stderr[-2000:]
        assert not os.path.exists(target)
    finally:
        shutil.rmtree(outer)


# ----- bounded memory --------------------------------------------------------------------------------
_MEMORY_SCRIPT = DEEP_MODEL + textwrap.dedent("""
    start = reset_peak()
    if sys.argv[2] == "file":
        h = torchlog.log_forward_pass(Deep(), x, save_to=sys.argv[1], random_seed=0)
    else:
        h = torchlog.log_forward_pass(Deep(), x, random_seed=0)
    growth = status("VmHWM") - start
    saved = sum(p.num_bytes for p in h if p.saved is not None and not p.is_output)
    print(f"logged {h.num_saved} activations; saved bytes {saved}; peak growth {growth}")
    print("last ok:", torch.equal(h[-2].tensor_contents, Deep()(x)))
""")


def test_streaming_logs_activations_four_times_the_memory_limit(tmp_path: Path) -> None:
    """Streaming a log holds at most a quarter of the activations it saves in memory at any
    time, while the in-memory log of the same model holds them all: the measure is real and
    streaming bounded.

    The peak resident set size (Linux VmHWM) is measured rather than enforcing an
    address-space limit: address space also counts what threads and allocators reserve
    but never touch, which made an RLIMIT_AS version of this test fail at random.
    """
    env = dict(os.environ, MALLOC_ARENA_MAX="2", OMP_NUM_THREADS="1")
    budget = 80 << 20  # bytes the streaming log may add to the process; the activations are 4x that

    def run(mode: str) -> tuple[str, int, int]:
        done = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT, str(tmp_path / f"{mode}.h5"), mode],
                              capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        saved, growth = re.search(r"saved bytes (\d+); peak growth (\d+)", done.stdout).groups()
        return done.stdout, int(saved), int(growth)

    streamed, saved, growth = run("file")
    assert "logged 42 activations" in streamed and "last ok: True" in streamed, streamed
    assert saved >= 4 * budget and growth <= budget, streamed
    in_memory, saved_in_memory, growth_in_memory = run("memory")
    # The in-memory log keeps the model's own tensors (saved without copying), some of them
    # in heap memory the warm-up pass freed and RSS still counted: at least 3/4 is new.
    assert saved_in_memory == saved and growth_in_memory >= saved * 3 // 4, in_memory
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(torchlog.load(tmp_path / "file.h5")) == 42
