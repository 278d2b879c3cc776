"""Tests of storage/gradients.py: gradients stream into the log file while backward runs."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import pytest
import torch
from torch import nn

import torchlog
from tests.models import SimpleRecurrent
from tests.storage.compare import assert_same_history, same_bits
from torchlog.errors import InvalidArgumentTypeError, LogFileError
from torchlog.storage.lazy import StoredTensor

ROOT = Path(__file__).resolve().parents[2]


def _log(path: Path | None, dtype: torch.dtype = torch.float32, batch: int = 4,
         **options) -> tuple[torchlog.ModelHistory, torch.Tensor, list[torch.Tensor]]:
    """Log SimpleRecurrent with gradient hooks; return the history, the model's real output
    and the outputs of its four `fc` calls (kept by forward hooks: with save_to, the saved
    copies come back from the file, cut from the graph)."""
    torch.manual_seed(0)
    model, x = SimpleRecurrent().to(dtype), torch.rand(batch, 5).to(dtype)
    outputs: list[torch.Tensor] = []
    fc_outputs: list[torch.Tensor] = []
    handles = [model.register_forward_hook(lambda m, i, out: outputs.append(out)),
               model.fc.register_forward_hook(lambda m, i, out: fc_outputs.append(out))]
    save_to = {} if path is None else {"save_to": path}
    history = torchlog.log_forward_pass(model, x, save_gradients=True, random_seed=0, **save_to, **options)
    for handle in handles:
        handle.remove()
    return history, outputs[-1], fc_outputs[-4:]


def _loss(t: torch.Tensor, seed: int = 1) -> torch.Tensor:
    """Fixed random weights, so every element gets its own gradient."""
    weights = torch.randn(t.shape, generator=torch.Generator().manual_seed(seed)).to(t.dtype)
    return (t * weights).sum()


def _assert_same_gradients(expected: torchlog.ModelHistory, actual: torchlog.ModelHistory) -> None:
    assert actual.layers_with_grads == expected.layers_with_grads != []
    for want, got in zip(expected, actual):
        assert want.label == got.label
        if want.grad_contents is None:
            assert got.grad_contents is None, got.label
        else:
            assert same_bits(got.grad_contents, want.grad_contents), got.label


def test_gradients_stream_to_the_file_and_read_back_exactly(tmp_path: Path) -> None:
    memory, out, _ = _log(None)
    _loss(out).backward()
    streamed, out, _ = _log(tmp_path / "run.h5")
    _loss(out).backward()
    _assert_same_gradients(memory, streamed)
    reached = [p for p in streamed if p.has_grad]
    assert all(isinstance(p.grad_saved, StoredTensor) for p in reached)  # no gradient kept in memory
    assert all(not isinstance(p.grad_saved, torch.Tensor) for p in streamed)


def test_gradient_datasets_are_readable_with_plain_h5py(tmp_path: Path) -> None:
    history, out, _ = _log(tmp_path / "run.h5")
    _loss(out).backward()
    with h5py.File(tmp_path / "run.h5", "r") as file:
        group = file["gradients"]
        assert sorted(group, key=int) == [str(p.op_index) for p in history if p.has_grad]
        for record in history:
            if record.has_grad:
                dataset = group[str(record.op_index)]
                assert dataset.attrs["torch_dtype"] == "float32"
                assert same_bits(torch.from_numpy(dataset[()]), record.grad_contents)
        assert file.attrs["status"] == "complete"


_LOAD_SCRIPT = textwrap.dedent("""
    import sys, torch, torchlog
    from torchlog.storage.lazy import StoredTensor
    history = torchlog.load(sys.argv[1])
    torchlog.lint(history)
    assert all(isinstance(p.grad_saved, StoredTensor) for p in history if p.has_grad)
    torch.save({p.label: p.grad_contents for p in history}, sys.argv[2])
""")


def _load_in_fresh_process(path: Path) -> dict[str, torch.Tensor | None]:
    """grad_contents by label, as another process loads them (it could not open a file
    this process still held open for writing)."""
    saved = path.with_suffix(".pt")
    done = subprocess.run([sys.executable, "-c", _LOAD_SCRIPT, str(path), str(saved)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return torch.load(saved)


def _assert_same_as(seen: dict[str, torch.Tensor | None], history: torchlog.ModelHistory) -> None:
    assert list(seen) == history.layer_labels
    for record in history:
        assert same_bits(seen[record.label], record.grad_contents) if record.has_grad else seen[record.label] is None


def test_a_fresh_process_loads_the_gradients(tmp_path: Path) -> None:
    history, out, _ = _log(tmp_path / "run.h5")
    _loss(out).backward()
    _assert_same_as(_load_in_fresh_process(tmp_path / "run.h5"), history)
    assert_same_history(history, torchlog.load(tmp_path / "run.h5"))  # records and every tensor


def test_after_a_backward_that_raised_the_next_one_finishes_the_file(tmp_path: Path) -> None:
    memory, out, _ = _log(None)
    _loss(out).backward()
    history, out, fc_outputs = _log(tmp_path / "run.h5")

    def stop(grad: torch.Tensor) -> None:
        raise ValueError("a user hook failed")

    handle = fc_outputs[1].register_hook(stop)
    with pytest.raises(ValueError, match="a user hook failed"):
        _loss(out).backward(retain_graph=True)
    assert "linear_1_1:2" in torchlog.load(tmp_path / "run.h5").layers_with_grads  # this process reads
    handle.remove()
    _loss(out).backward()
    _assert_same_gradients(memory, history)
    _assert_same_as(_load_in_fresh_process(tmp_path / "run.h5"), history)


def test_a_second_backward_overwrites_as_in_memory(tmp_path: Path) -> None:
    """The second backward starts at the second `fc` call: passes after it keep the first gradients."""
    memory, out, fc_outputs = _log(None, batch=256)
    _loss(out).backward(retain_graph=True)
    _loss(fc_outputs[1], seed=2).backward()
    streamed, out, fc_outputs = _log(tmp_path / "run.h5", batch=256)
    _loss(out).backward(retain_graph=True)
    first = {p.label: p.grad_contents for p in streamed if p.has_grad}
    size = os.path.getsize(tmp_path / "run.h5")
    _loss(fc_outputs[1], seed=2).backward()

    _assert_same_gradients(memory, streamed)
    changed = {p.label for p in streamed if p.has_grad and not same_bits(p.grad_contents, first[p.label])}
    assert changed and "linear_1_1:2" in changed and "output_1_4" not in changed
    loaded = torchlog.load(tmp_path / "run.h5")
    torchlog.lint(loaded)
    assert_same_history(streamed, loaded)
    grad_bytes = sum(p.grad_contents.numel() * 4 for p in streamed if p.label in changed)
    assert os.path.getsize(tmp_path / "run.h5") - size < grad_bytes / 2  # space reused, not appended


def test_bfloat16_gradients_round_trip(tmp_path: Path) -> None:
    memory, out, _ = _log(None, dtype=torch.bfloat16)
    _loss(out).backward()
    streamed, out, _ = _log(tmp_path / "run.h5", dtype=torch.bfloat16)
    _loss(out).backward()
    _assert_same_gradients(memory, streamed)
    loaded = torchlog.load(tmp_path / "run.h5")
    torchlog.lint(loaded)
    _assert_same_gradients(memory, loaded)
    with h5py.File(tmp_path / "run.h5", "r") as file:
        dataset = file["gradients"][str(streamed["linear_1_1:1"].op_index)]
        assert dataset.dtype == "uint16" and dataset.attrs["torch_dtype"] == "bfloat16"


def test_pruned_passes_get_no_gradient_on_disk(tmp_path: Path) -> None:
    history, out, _ = _log(tmp_path / "run.h5", layers_to_save=["linear_1_1:3", "output_1_4"])
    _loss(out).backward()
    assert history.layers_with_grads == ["linear_1_1:3", "output_1_4"]
    with h5py.File(tmp_path / "run.h5", "r") as file:
        assert sorted(file["gradients"], key=int) == [str(p.op_index) for p in history]
    assert torchlog.load(tmp_path / "run.h5").layers_with_grads == ["linear_1_1:3", "output_1_4"]


def test_save_copies_streamed_gradients_to_a_new_file(tmp_path: Path) -> None:
    history, out, _ = _log(tmp_path / "a.h5")
    _loss(out).backward()
    history.save(tmp_path / "b.h5")
    os.remove(tmp_path / "a.h5")  # b holds its own copies
    copy = torchlog.load(tmp_path / "b.h5")
    assert copy.layers_with_grads == history.layers_with_grads != []
    assert isinstance(copy["linear_1_1:1"].grad_saved, StoredTensor)
    assert copy["linear_1_1:1"].grad_contents.shape == (4, 5)


def test_the_file_gradients_are_read_from_cannot_be_overwritten_by_save(tmp_path: Path) -> None:
    history, out, _ = _log(tmp_path / "run.h5", layers_to_save=None)  # gradients are the only tensors
    _loss(out).backward()
    with pytest.raises(LogFileError, match="reads its tensors from it"):
        history.save(tmp_path / "run.h5", overwrite=True)
    assert torchlog.load(tmp_path / "run.h5")["linear_1_1:1"].has_grad


# ----- the file cannot take the gradient ----------------------------------------------------------
def test_a_file_open_read_only_in_this_process_stops_backward_with_a_clear_error(tmp_path: Path) -> None:
    _, out, _ = _log(tmp_path / "run.h5")
    with h5py.File(tmp_path / "run.h5", "r"), pytest.raises(LogFileError, match="open read-only in this process"):
        _loss(out).backward(retain_graph=True)
    _loss(out).backward()  # closed again: the gradients go in
    assert torchlog.load(tmp_path / "run.h5").layers_with_grads[-1] == "output_1_4"


def test_a_replaced_file_is_not_written(tmp_path: Path) -> None:
    _, out, _ = _log(tmp_path / "run.h5")
    other = torchlog.log_forward_pass(nn.ReLU(), torch.ones(3), save_to=tmp_path / "run.h5", overwrite=True)
    with pytest.raises(LogFileError, match="holds another log now"):
        _loss(out).backward()
    with h5py.File(tmp_path / "run.h5", "r") as file:
        assert "gradients" not in file
    assert torchlog.load(tmp_path / "run.h5").layer_labels == other.layer_labels


def test_log_backward_explains_that_saved_tensors_come_from_the_file(tmp_path: Path) -> None:
    history, _, _ = _log(tmp_path / "run.h5")
    with pytest.raises(InvalidArgumentTypeError, match="read back from the file.*forward_hook"):
        history.log_backward(_loss(history[-1].tensor_contents))


# ----- crash safety ---------------------------------------------------------------------------------
_KILLED_MID_BACKWARD = textwrap.dedent("""
    import os, signal, sys, torch
    from tests.storage.test_storage_gradients import _log, _loss
    history, out, fc_outputs = _log(sys.argv[1])
    # Runs after the gradient of linear_1_1:2 is written (hooks run in the order registered).
    fc_outputs[1].register_hook(lambda grad: os.kill(os.getpid(), signal.SIGKILL))
    _loss(out).backward()
    print("not killed")
""")


def test_gradients_written_before_the_process_died_read_back(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", _KILLED_MID_BACKWARD, str(tmp_path / "run.h5")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr
    memory, out, _ = _log(None)
    _loss(out).backward()
    loaded = torchlog.load(tmp_path / "run.h5")
    reached = set(loaded.layers_with_grads)
    assert {"output_1_4", "linear_1_1:2"} <= reached and "linear_1_1:1" not in reached
    for record in loaded:
        if record.has_grad:
            assert same_bits(record.grad_contents, memory[record.label].grad_contents), record.label
