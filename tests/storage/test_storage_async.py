"""Tests of storage/background.py: activations written by a thread while the forward pass goes on."""
from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import h5py
import pytest
import torch
from torch import nn

import torchlog
from tests.models import TINY_MODELS, AlexNet, MutatedThroughView
from tests.storage.compare import assert_same_history, same_bits
from tests.storage.memory_scripts import DEEP_MODEL
from torchlog.errors import IncompleteLogWarning
from torchlog.storage import background, writer
from torchlog.storage.background import WriteQueue

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["fast", "slow"])
def writer_speed(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """'slow' makes each write wait, so values are still queued when the model writes into them."""
    if request.param == "slow":
        write = writer._Stream.write_activation

        def slow(self, nodes, index, value):
            time.sleep(0.003)
            write(self, nodes, index, value)

        monkeypatch.setattr(writer._Stream, "write_activation", slow)
    return request.param


def _threads_after(call) -> int:
    before = threading.active_count()
    try:
        call()
    finally:
        gc.collect()
    return threading.active_count() - before


def _same_in_file(model: nn.Module, x: torch.Tensor, path: Path) -> torchlog.ModelHistory:
    """Log `model` in memory and to `path`; the file must hold the same values, bit for bit."""
    in_memory = torchlog.log_forward_pass(model, x, random_seed=0)
    streamed = torchlog.log_forward_pass(model, x, random_seed=0, save_to=path)
    assert_same_history(in_memory, streamed, same_run=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = torchlog.load(path)
    assert_same_history(in_memory, loaded, same_run=False)
    return in_memory


# ----- values are the ones the ops produced ------------------------------------------------------
class SavedThenWritten(nn.Module):
    """Saved tensors written in place afterwards, by every announced route."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        y = self.lin(x)
        y = self.relu(y)  # ReLU(inplace=True) after a saved op
        z = y * 2
        z.add_(1)  # a method write after z was saved
        row = z[:, 1:3]
        row[0] = 7.0  # setitem on a view of a saved tensor
        torch.mul(y, 3, out=y)
        return z + y


class HiddenWrite(nn.Module):
    """Writes into a saved tensor where capture cannot see it."""

    num_calls = 0

    def forward(self, x):
        HiddenWrite.num_calls += 1
        y = x * 2
        with torch._C.DisableTorchFunction():
            y.add_(1)
        return y + torch.ones(256, 256).sum()


@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_tiny_models_store_the_in_memory_values(tmp_path: Path, name: str, writer_speed: str) -> None:
    factory, make_input = TINY_MODELS[name]
    torch.manual_seed(0)
    _same_in_file(factory(), make_input(), tmp_path / "run.h5")


@pytest.mark.parametrize("model", [SavedThenWritten, MutatedThroughView])
def test_values_written_in_place_after_they_were_saved_are_stored_as_saved(
        tmp_path: Path, model: type, writer_speed: str) -> None:
    torch.manual_seed(0)
    with torch.no_grad():  # out= refuses tensors that require grad
        _same_in_file(model(), torch.randn(4, 16), tmp_path / "run.h5")


def test_a_cnn_with_inplace_relus_stores_the_in_memory_values(tmp_path: Path, writer_speed: str) -> None:
    torch.manual_seed(0)
    with torch.no_grad():
        _same_in_file(AlexNet().eval(), torch.randn(1, 3, 96, 96), tmp_path / "run.h5")


def test_a_write_nothing_announced_runs_the_pass_again_and_stores_the_value_before_it(
        tmp_path: Path, writer_speed: str) -> None:
    x = torch.randn(64, 64)
    history = _same_in_file(HiddenWrite(), x, tmp_path / "run.h5")
    assert same_bits(torchlog.load(tmp_path / "run.h5")["mul_1_1"].tensor_contents, x * 2)
    assert same_bits(history["mul_1_1"].tensor_contents, x * 2)
    with h5py.File(tmp_path / "run.h5") as file:  # the rerun started the file over
        assert sorted(file["activations"], key=int) == [str(p.op_index) for p in history if not p.is_output]
        assert file.attrs["status"] == "complete"
    if writer_speed == "slow":  # the value was still queued at the write: a second run copied it
        HiddenWrite.num_calls = 0
        torchlog.log_forward_pass(HiddenWrite(), x, save_to=tmp_path / "again.h5")
        assert HiddenWrite.num_calls == 2


def test_stale_values_are_listed_and_copied_on_the_next_run(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer itself reports the hidden write, and copies that node when the pass runs again."""
    released = threading.Event()
    write = writer._Stream.write_activation

    def held(self, nodes, index, value):
        released.wait(10)
        write(self, nodes, index, value)

    monkeypatch.setattr(writer._Stream, "write_activation", held)
    log = writer.LogWriter(tmp_path / "run.h5")
    y = torch.zeros(3)
    log.sink([], 0, y)
    y.add_(1)  # unannounced, while the value is queued
    released.set()
    log.settle(None)
    assert log.stale() == [0]
    nodes: list = []  # a new pass
    z = torch.zeros(3)
    log.sink(nodes, 0, z)
    z.add_(1)  # copied at hand-over this time: no longer stale
    log.settle(None)
    assert log.stale() == []
    log.finish(None)
    assert not log._queue._thread.is_alive()


# ----- the queue bound -------------------------------------------------------------------------
def test_queued_bytes_never_exceed_the_bound() -> None:
    seen: list[int] = []
    queue: WriteQueue

    def write(nodes, index, value):
        seen.append(queue._num_bytes)
        time.sleep(0.001)

    queue = WriteQueue(write, max_bytes=10_000)
    for i in range(60):
        queue.put([], i, torch.zeros(1000))  # 4000 bytes: two fit
    queue.put([], 60, torch.zeros(5000))  # bigger than the bound: passes alone
    queue.settle(None)
    queue.close()
    assert len(seen) == 61 and max(seen[:60]) <= 10_000 and seen[-1] == 20_000
    assert not queue._thread.is_alive()


_MEMORY_SCRIPT = DEEP_MODEL + textwrap.dedent("""
    import time
    from torchlog.storage import background, writer
    background.DEFAULT_MAX_BYTES = 16 * MB
    write = writer._Stream.write_activation

    def slow(self, nodes, index, value):  # a writer far slower than the model
        time.sleep(0.02)
        write(self, nodes, index, value)

    writer._Stream.write_activation = slow
    start = reset_peak()
    h = torchlog.log_forward_pass(Deep(), x, save_to=sys.argv[1], random_seed=0)
    growth = status("VmHWM") - start
    print(f"peak growth {growth}; last ok: {torch.equal(h[-2].tensor_contents, Deep()(x))}")
""")


def test_a_slow_writer_holds_the_forward_pass_to_the_queue_bound(tmp_path: Path) -> None:
    """320 MB of activations through a 16 MB queue: the pass waits instead of piling them up."""
    env = dict(os.environ, MALLOC_ARENA_MAX="2", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT, str(tmp_path / "run.h5")],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    growth = int(re.search(r"peak growth (\d+)", done.stdout).group(1))
    assert "last ok: True" in done.stdout
    # The queue, the value being written, the model's current tensors and HDF5's buffers.
    assert growth <= 56 << 20, done.stdout


# ----- errors and threads ----------------------------------------------------------------------
class Steps(nn.Module):
    def __init__(self, fail_at: int | None = None, interrupt: bool = False) -> None:
        super().__init__()
        self.fail_at, self.interrupt = fail_at, interrupt

    def forward(self, x):
        for step in range(6):
            if step == self.fail_at:
                raise KeyboardInterrupt if self.interrupt else ValueError(f"bad step {step}")
            x = torch.tanh(x) * 2
        return x


@pytest.mark.parametrize("failing_op", [3, 12])  # mid-pass (next sink call) and last (at finish)
def test_an_error_in_the_writer_thread_is_raised_and_leaves_an_incomplete_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing_op: int) -> None:
    write = writer._Stream.write_activation

    def failing(self, nodes, index, value):
        if index == failing_op:
            raise OSError(f"disk full writing op #{index}")
        write(self, nodes, index, value)

    monkeypatch.setattr(writer._Stream, "write_activation", failing)

    def run() -> None:
        with pytest.raises(OSError, match=f"disk full writing op #{failing_op}"):
            torchlog.log_forward_pass(Steps(), torch.randn(5), save_to=tmp_path / "run.h5")

    assert _threads_after(run) == 0
    with pytest.warns(IncompleteLogWarning, match="could not be stored: disk full"):
        loaded = torchlog.load(tmp_path / "run.h5")
    assert loaded.num_saved < len(loaded)
    for record in loaded:  # what reached the file reads back; the rest is not saved
        if record.saved is not None:
            assert record.op_index < failing_op
            assert record.tensor_contents.shape == (5,)


@pytest.mark.parametrize("failure", ["none", "model", "interrupt"])
def test_no_writer_thread_outlives_a_log_call(tmp_path: Path, failure: str) -> None:
    model = {"none": Steps(), "model": Steps(fail_at=4), "interrupt": Steps(fail_at=4, interrupt=True)}[failure]

    def run() -> None:
        expected = {"none": None, "model": ValueError, "interrupt": KeyboardInterrupt}[failure]
        if expected is None:
            torchlog.log_forward_pass(model, torch.randn(5), save_to=tmp_path / "run.h5")
            return
        with pytest.raises(expected):
            torchlog.log_forward_pass(model, torch.randn(5), save_to=tmp_path / "run.h5")

    assert _threads_after(run) == 0
    if failure != "none":
        with pytest.warns(IncompleteLogWarning):
            assert torchlog.load(tmp_path / "run.h5").is_partial


def test_a_writer_dropped_unfinished_stops_its_thread(tmp_path: Path) -> None:
    def run() -> None:
        log = writer.LogWriter(tmp_path / "run.h5")
        log.sink([], 0, torch.ones(4))
        assert threading.active_count() > 1

    assert _threads_after(run) == 0
    gc.collect()
    with h5py.File(tmp_path / "run.h5") as file:  # queued values were written before it stopped
        assert file["activations/0"][()].tolist() == [1.0] * 4
