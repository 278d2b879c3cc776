"""`log_generation(save_to=path)`: one HDF5 file for the whole generation, each step appended
as it ends; the file holds what forward hooks read, `torchlog.load_generation` opens it again,
and a generation that raises (or a process that dies) leaves the steps it finished."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import torchlog
from torchlog.errors import (
    IncompleteLogWarning,
    InvalidOptionError,
    LogFileError,
    LogFileExistsError,
    LogFileNotFoundError,
)

from .decoding import CACHE, SITE, recorded_generate, tiny_gpt2

h5py = pytest.importorskip("h5py")
pytestmark = pytest.mark.heavy
STEPS = 4
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def gpt2():
    return tiny_gpt2()


def test_one_file_holds_every_step_as_a_hook_read_it(gpt2, tmp_path) -> None:
    model, prompt = gpt2
    path = tmp_path / "gen.h5"
    gen = torchlog.log_generation(model, prompt, max_new_tokens=STEPS, do_sample=False, save_to=path,
                                  layers_to_save=[SITE])
    sequences, seen = recorded_generate(model, prompt, SITE, max_new_tokens=STEPS, do_sample=False)
    assert torch.equal(gen.sequences, sequences) and gen.path == str(path)
    assert os.listdir(tmp_path) == ["gen.h5"]  # the steps' scratch logs are gone
    loaded = torchlog.load_generation(path)
    assert loaded.num_steps == STEPS and not loaded.is_partial and loaded.output is None
    assert torch.equal(loaded.sequences, sequences) and torch.equal(loaded.prompt, prompt)
    for k in range(STEPS):
        torch.testing.assert_close(loaded[k, SITE].tensor_contents, seen[k], rtol=1e-5, atol=1e-6)
        assert torch.equal(gen[k, SITE].tensor_contents, loaded[k, SITE].tensor_contents)
        assert torch.equal(loaded.logits(k), gen.logits(k)) and torch.equal(loaded.input_ids(k), gen.input_ids(k))
        assert torch.equal(loaded.token(k), sequences[:, 6 + k])
        assert loaded.steps[k].layer_labels == gen.steps[k].layer_labels
    with h5py.File(path, "r") as file:  # the layout docs/storage.md describes
        assert file.attrs["status"] == "complete" and file.attrs["num_steps"] == STEPS
        assert sorted(file["steps"]) == [str(k) for k in range(STEPS)]
        assert "metadata" in file["steps/2"] and len(file["steps/2/activations"]) == 1


def test_interventions_and_every_saved_value_come_back_from_the_file(gpt2, tmp_path) -> None:
    model, prompt = gpt2
    vector = torch.full((32,), 3.0)
    action = torchlog.interventions.add(vector)
    memory = torchlog.log_generation(model, prompt, max_new_tokens=3, do_sample=False,
                                     intervene={"transformer.h.0": action}, intervene_steps=[1])
    gen = torchlog.log_generation(model, prompt, max_new_tokens=3, do_sample=False, save_to=tmp_path / "g.h5",
                                  intervene={"transformer.h.0": action}, intervene_steps=[1])
    loaded = torchlog.load_generation(tmp_path / "g.h5")
    assert torch.equal(gen.sequences, memory.sequences) and torch.equal(loaded.sequences, memory.sequences)
    assert [(i.step, i.record.site) for i in loaded.interventions] == [(1, "transformer.h.0")]
    for k in range(3):
        assert memory.steps[k].layer_labels == loaded.steps[k].layer_labels
        for label in memory.steps[k].layer_labels:
            assert torch.equal(torch.as_tensor(memory[k, label].tensor_contents),
                               torch.as_tensor(loaded[k, label].tensor_contents)), (k, label)


def _three_steps_then(model, ids, failure):
    cache, step_ids = None, ids
    for _ in range(3):
        out = model(step_ids, use_cache=True, **{CACHE: cache})
        cache, step_ids = getattr(out, CACHE), out.logits[:, -1:].argmax(-1)
    return failure(model, step_ids, cache)


def test_a_generation_that_raises_keeps_the_steps_it_finished(gpt2, tmp_path) -> None:
    model, prompt = gpt2

    def broken(model, step_ids, cache):
        raise RuntimeError("the decode loop broke after 3 steps")

    with pytest.raises(RuntimeError, match="broke after 3 steps") as info:
        torchlog.log_generation(model, prompt, decode=lambda m, ids: _three_steps_then(m, ids, broken),
                                save_to=tmp_path / "gen.h5")
    done = info.value.torchlog_generation
    assert done.num_steps == 3 and os.listdir(tmp_path) == ["gen.h5"]
    with pytest.warns(IncompleteLogWarning, match="RuntimeError: the decode loop broke after 3 steps; 3 steps"):
        loaded = torchlog.load_generation(tmp_path / "gen.h5")
    assert loaded.is_partial and loaded.num_steps == 3 and loaded.failed_step is None
    for k in range(3):  # each step's own logits chose the token the next step read
        logits = loaded[k, loaded.steps[k].output_layers[0]].tensor_contents
        assert torch.equal(logits[:, -1], loaded.logits(k))
        if k < 2:
            assert torch.equal(logits[:, -1:].argmax(-1), loaded.input_ids(k + 1))


def test_a_step_whose_forward_raises_is_kept_as_the_failed_step(gpt2, tmp_path) -> None:
    model, prompt = gpt2

    def bad_step(model, step_ids, cache):
        return model(step_ids.float(), use_cache=True, **{CACHE: cache})  # embedding refuses floats

    with pytest.raises(Exception) as info:
        torchlog.log_generation(model, prompt, decode=lambda m, ids: _three_steps_then(m, ids, bad_step),
                                save_to=tmp_path / "gen.h5")
    partial = info.value.torchlog_history  # read from the generation file: its scratch log is gone
    assert partial.is_partial and partial.path == str(tmp_path / "gen.h5")
    with pytest.warns(IncompleteLogWarning):
        loaded = torchlog.load_generation(tmp_path / "gen.h5")
    assert loaded.num_steps == 3 and loaded.failed_step.layer_labels == partial.layer_labels
    first = partial.layer_labels[0]
    assert torch.equal(loaded.failed_step[first].tensor_contents, partial[first].tensor_contents)


def test_a_killed_process_leaves_a_file_with_the_steps_done(tmp_path) -> None:
    path = tmp_path / "gen.h5"
    script = textwrap.dedent(f"""
        import os, torch, torchlog
        class Counter(torch.nn.Module):
            def forward(self, ids):
                return torch.nn.functional.one_hot((ids + 1) % 10, 10).float()
        def dies(model, ids):
            for k in range(5):
                if k == 3:
                    os._exit(3)  # no finally, no atexit: as a killed process
                ids = torch.cat([ids, model(ids)[:, -1:].argmax(-1)], dim=-1)
        torchlog.log_generation(Counter(), torch.tensor([[4]]), decode=dies, save_to={str(path)!r})
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr[-2000:]
    with pytest.warns(IncompleteLogWarning, match="stopped before the generation ended"):
        loaded = torchlog.load_generation(path)
    assert loaded.num_steps == 3 and loaded.sequences is None
    assert [loaded.input_ids(k).tolist() for k in range(2)] == [[[4]], [[4, 5]]]
    out = loaded.steps[2].output_layers[0]
    assert loaded[2, out].tensor_contents[:, -1].argmax(-1).tolist() == [7]


def test_an_existing_file_is_refused_unless_overwrite(gpt2, tmp_path) -> None:
    model, prompt = gpt2
    path = tmp_path / "gen.h5"
    torchlog.log_generation(model, prompt, max_new_tokens=STEPS, do_sample=False, save_to=path, layers_to_save=None)
    with pytest.raises(LogFileExistsError, match=r"gen.h5' already exists; pass overwrite=True"):
        torchlog.log_generation(model, prompt, max_new_tokens=2, do_sample=False, save_to=path)
    torchlog.log_generation(model, prompt, max_new_tokens=2, do_sample=False, save_to=path, overwrite=True,
                            layers_to_save=None)
    assert torchlog.load_generation(path).num_steps == 2


def test_bad_paths_and_options_are_refused_before_the_model_runs(gpt2, tmp_path) -> None:
    model, prompt = gpt2
    calls: list[int] = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        with pytest.raises(LogFileError, match=r"is a folder; a generation is written to one HDF5 file"):
            torchlog.log_generation(model, prompt, max_new_tokens=2, save_to=tmp_path)
        with pytest.raises(LogFileNotFoundError, match="does not exist; create it first"):
            torchlog.log_generation(model, prompt, max_new_tokens=2, save_to=tmp_path / "no" / "gen.h5")
        with pytest.raises(InvalidOptionError, match="save_gradients=True with save_to"):
            torchlog.log_generation(model, prompt, max_new_tokens=2, save_to=tmp_path / "g.h5", save_gradients=True)
    finally:
        handle.remove()
    assert not calls and os.listdir(tmp_path) == []


def test_loading_names_the_right_opener(gpt2, tmp_path) -> None:
    model, prompt = gpt2
    torchlog.log_forward_pass(model, prompt, save_to=tmp_path / "one.h5", layers_to_save=None)
    with pytest.raises(LogFileError, match=r"is a 'torchlog' file, not a 'torchlog-generation' file; open it "
                                           r"with torchlog.load\(path\)"):
        torchlog.load_generation(tmp_path / "one.h5")
    torchlog.log_generation(model, prompt, max_new_tokens=2, save_to=tmp_path / "gen.h5", layers_to_save=None)
    with pytest.raises(LogFileError, match=r"open it with torchlog.load_generation\(path\)"):
        torchlog.load(tmp_path / "gen.h5")


class _Counter(torch.nn.Module):
    """Next token: the last one plus one."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot((ids + 1) % 10, 10).float()


def _greedy(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    for _ in range(3):
        ids = torch.cat([ids, model(ids)[:, -1:].argmax(-1)], dim=-1)
    return ids


def test_a_chosen_step_never_reached_still_leaves_a_complete_file(tmp_path) -> None:
    with pytest.raises(torchlog.StepNotFoundError, match=r"holds step\(s\) \[5\]") as info:
        torchlog.log_generation(_Counter(), torch.tensor([[4]]), decode=_greedy, intervene=lambda step: None,
                                intervene_steps=[5], save_to=tmp_path / "gen.h5")
    loaded = torchlog.load_generation(tmp_path / "gen.h5")  # no warning: generation returned
    assert not loaded.is_partial and torch.equal(loaded.sequences, info.value.torchlog_generation.sequences)
    assert loaded.tokens.tolist() == [[5, 6, 7]] and loaded.logits(2).argmax(-1).tolist() == [7]
