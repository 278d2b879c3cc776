"""`log_generation(save_to=folder)`: each step streamed into its own HDF5 log as it runs; the
files hold what forward hooks read, and a generation that raises keeps the steps it finished."""
from __future__ import annotations

import os

import pytest
import torch

import torchlog
from torchlog.errors import LogFileExistsError, LogFileNotFoundError

from .decoding import CACHE, SITE, recorded_generate, tiny_gpt2

pytest.importorskip("h5py")
pytestmark = pytest.mark.heavy
STEPS = 4


@pytest.fixture(scope="module")
def gpt2():
    return tiny_gpt2()


def _step_files(folder) -> list[str]:
    return sorted(os.listdir(folder))


def test_each_step_is_a_log_file_holding_what_a_hook_read(gpt2, tmp_path) -> None:
    model, prompt = gpt2
    folder = tmp_path / "gen"  # created by log_generation
    gen = torchlog.log_generation(model, prompt, max_new_tokens=STEPS, do_sample=False, save_to=folder,
                                  layers_to_save=[SITE])
    sequences, seen = recorded_generate(model, prompt, SITE, max_new_tokens=STEPS, do_sample=False)
    assert torch.equal(gen.sequences, sequences)
    assert _step_files(folder) == [f"step_{k:04d}.h5" for k in range(STEPS)]
    for k in range(STEPS):
        stored = torchlog.load(folder / f"step_{k:04d}.h5")
        torch.testing.assert_close(stored[SITE].tensor_contents, seen[k], rtol=1e-5, atol=1e-6)
        assert torch.equal(gen[k, SITE].tensor_contents, stored[SITE].tensor_contents)


def test_a_generation_that_raises_keeps_the_files_of_the_steps_it_finished(gpt2, tmp_path) -> None:
    model, prompt = gpt2
    seen: list[torch.Tensor] = []

    def three_steps_then_fail(model, ids):
        cache, step_ids = None, ids
        for _ in range(3):
            out = model(step_ids, use_cache=True, **{CACHE: cache})
            cache = getattr(out, CACHE)
            step_ids = out.logits[:, -1:].argmax(-1)
            seen.append(step_ids)
        raise RuntimeError("the decode loop broke after 3 steps")

    with pytest.raises(RuntimeError, match="broke after 3 steps") as info:
        torchlog.log_generation(model, prompt, decode=three_steps_then_fail, save_to=tmp_path / "gen")
    assert info.value.torchlog_generation.num_steps == 3
    assert _step_files(tmp_path / "gen") == ["step_0000.h5", "step_0001.h5", "step_0002.h5"]
    for k in range(3):  # each file is a finished log: its logits choose the token the loop chose
        stored = torchlog.load(tmp_path / "gen" / f"step_{k:04d}.h5")
        logits = stored[stored.output_layers[0]].tensor_contents
        assert torch.equal(logits[:, -1:].argmax(-1), seen[k])


def test_a_folder_holding_step_logs_is_refused_unless_overwrite(gpt2, tmp_path) -> None:
    model, prompt = gpt2
    folder = tmp_path / "gen"
    torchlog.log_generation(model, prompt, max_new_tokens=STEPS, do_sample=False, save_to=folder, layers_to_save=None)
    with pytest.raises(LogFileExistsError, match=r"already holds step logs \(step_0000.h5, .*overwrite=True"):
        torchlog.log_generation(model, prompt, max_new_tokens=2, do_sample=False, save_to=folder)
    # overwrite=True replaces them, and a shorter generation leaves no step of the longer one
    torchlog.log_generation(model, prompt, max_new_tokens=2, do_sample=False, save_to=folder, overwrite=True,
                            layers_to_save=None)
    assert _step_files(folder) == ["step_0000.h5", "step_0001.h5"]


def test_a_file_or_a_missing_parent_is_refused_before_the_model_runs(gpt2, tmp_path) -> None:
    model, prompt = gpt2
    calls: list[int] = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        a_file = tmp_path / "run.h5"
        a_file.write_bytes(b"")
        with pytest.raises(LogFileExistsError, match="is a file; it takes a folder"):
            torchlog.log_generation(model, prompt, max_new_tokens=2, save_to=a_file)
        with pytest.raises(LogFileNotFoundError, match="does not exist; create it first"):
            torchlog.log_generation(model, prompt, max_new_tokens=2, save_to=tmp_path / "no" / "gen")
    finally:
        handle.remove()
    assert not calls
    assert not (tmp_path / "no").exists()
