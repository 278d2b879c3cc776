"""storage/generation_file.py: step logs appended to one file, read back lazily; `num_steps` is
the commit point, so a step half copied is never read."""
from __future__ import annotations

import os

import pytest
import torch

import torchlog
from torchlog.errors import LogFileError

h5py = pytest.importorskip("h5py")
from torchlog.storage.generation_file import GenerationFile, read_generation  # noqa: E402


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def _write_steps(path, inputs: list[torch.Tensor]) -> list[torchlog.ModelHistory]:
    """Log one pass per input into a generation file, as log_generation does; return the
    in-memory histories of the same passes."""
    model, prompt = _model(), torch.tensor([[1, 2]])
    file = GenerationFile(path, False, "Sequential", prompt, num_beams=1)
    expected = []
    for k, x in enumerate(inputs):
        torchlog.log_forward_pass(model, x, save_to=file.step_path(k))
        file.append_step(k)
        file.add_tokens(k, torch.tensor([[k]]), x.sum(-1))
        expected.append(torchlog.log_forward_pass(model, x))
    file.finish(torch.tensor([[1, 2, 0, 1]]), None)
    return expected


def test_steps_read_back_equal_the_passes_logged_in_memory(tmp_path) -> None:
    inputs = [torch.randn(2, 3), torch.randn(1, 3)]
    expected = _write_steps(tmp_path / "g.h5", inputs)
    assert os.listdir(tmp_path) == ["g.h5"]  # the scratch folder is removed by finish
    stored = read_generation(tmp_path / "g.h5")
    assert stored.failure is None and stored.failed_step is None and stored.num_beams == 1
    assert stored.sequences.tolist() == [[1, 2, 0, 1]] and stored.prompt.tolist() == [[1, 2]]
    assert len(stored.steps) == 2
    for k, (step, memory) in enumerate(zip(stored.steps, expected)):
        assert step.history.layer_labels == memory.layer_labels
        for label in memory.layer_labels:
            value = step.history[label].saved
            assert isinstance(value, torchlog.storage.StoredTensor)  # read on access, not before
            assert value.name.startswith(f"steps/{k}/")
            assert torch.equal(step.history[label].tensor_contents, memory[label].tensor_contents)
        assert step.input_ids.tolist() == [[k]]
        torch.testing.assert_close(step.logits, inputs[k].sum(-1))


def test_a_step_not_committed_by_num_steps_is_not_read(tmp_path) -> None:
    path = tmp_path / "g.h5"
    _write_steps(path, [torch.randn(2, 3), torch.randn(2, 3)])
    with h5py.File(path, "r+") as file:  # as a process killed while copying step 1 in
        file.attrs["num_steps"] = 1
        file.attrs["status"] = "writing"
    stored = read_generation(path)
    assert len(stored.steps) == 1 and stored.failure == "the writing process stopped before the generation ended"


def test_a_folder_a_newer_version_and_damaged_records_are_refused(tmp_path) -> None:
    with pytest.raises(LogFileError, match="is a folder; a generation is written to one HDF5 file"):
        GenerationFile(tmp_path, False, "m", torch.tensor([[1]]))
    path = tmp_path / "g.h5"
    _write_steps(path, [torch.randn(1, 3)])
    with h5py.File(path, "r+") as file:
        file.attrs["format_version"] = 99
    with pytest.raises(LogFileError, match="format version 99"):
        read_generation(path)
    with h5py.File(path, "r+") as file:
        file.attrs["format_version"] = 1
        del file["steps/0/metadata"]
    with pytest.raises(LogFileError, match=r"g.h5' is damaged: cannot read its records"):
        read_generation(path)
