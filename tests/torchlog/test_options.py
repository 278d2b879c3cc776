"""Tests of torchlog/options.py: LogOptions, and how log_forward_pass merges keywords into it."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn

import torchlog
from tests.models import SimpleRecurrent
from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError
from torchlog.options import LogOptions, merge_options

# The keywords log_forward_pass took before LogOptions, under TorchLens's names.
TORCHLENS_NAMES = ["layers_to_save", "keep_unsaved_layers", "output_device", "detach_saved_tensors",
                   "random_seed", "activation_postfunc", "save_function_args", "on_error",
                   "save_gradients", "save_to", "overwrite"]


def test_every_keyword_is_a_field_with_the_old_default() -> None:
    fields = {f.name: f.default for f in dataclasses.fields(LogOptions)}
    assert list(fields) == TORCHLENS_NAMES + ["profile", "intervene", "stop_after"]  # torchlog's own
    assert fields == {"layers_to_save": "all", "keep_unsaved_layers": False, "output_device": "same",
                      "detach_saved_tensors": False, "random_seed": None, "activation_postfunc": None,
                      "save_function_args": False, "on_error": "raise", "save_gradients": False,
                      "save_to": None, "overwrite": False, "profile": False, "intervene": None,
                      "stop_after": None}


def test_options_are_frozen_and_checked_when_made() -> None:
    options = LogOptions(random_seed=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.random_seed = 4  # type: ignore[misc]
    with pytest.raises(InvalidOptionError, match="-1"):
        LogOptions(random_seed=-1)
    with pytest.raises(InvalidArgumentTypeError, match="'yes'"):
        LogOptions(overwrite="yes")
    with pytest.raises(InvalidOptionError, match="detach_saved_tensors=False"):
        LogOptions(save_gradients=True, detach_saved_tensors=True)
    with pytest.raises(InvalidOptionError, match=r"\[\]"):
        LogOptions(layers_to_save=[])


def test_device_and_entries_are_derived_not_stored() -> None:
    options = LogOptions(output_device="cpu", layers_to_save="linear_1_1")
    assert options.device == torch.device("cpu") and options.output_device == "cpu"
    assert options.entries == ["linear_1_1"]
    assert LogOptions().device is None and LogOptions().entries is None
    assert LogOptions(layers_to_save=None).entries == []


def test_an_options_object_logs_like_the_same_keywords() -> None:
    x = torch.rand(2, 5)
    options = LogOptions(layers_to_save=["add_1_2"], keep_unsaved_layers=True, random_seed=5)
    by_object = torchlog.log_forward_pass(SimpleRecurrent(), x, options=options)
    by_keywords = torchlog.log_forward_pass(SimpleRecurrent(), x, layers_to_save=["add_1_2"],
                                            keep_unsaved_layers=True, random_seed=5)
    assert by_object.layer_labels == by_keywords.layer_labels
    assert [p.label for p in by_object if p.saved is not None] == [f"add_1_2:{k}" for k in range(1, 5)]
    assert by_object.random_seed == 5


def test_keywords_override_the_object_which_stays_as_it_was() -> None:
    options = LogOptions(layers_to_save=None, random_seed=1)
    history = torchlog.log_forward_pass(nn.ReLU(), torch.ones(2), options=options, random_seed=2,
                                        layers_to_save="all")
    assert history.random_seed == 2 and history.num_saved == len(history)
    assert options == LogOptions(layers_to_save=None, random_seed=1)


def test_one_object_serves_many_calls_with_fresh_seeds() -> None:
    options = LogOptions(layers_to_save=["relu"])
    seeds = {torchlog.log_forward_pass(nn.ReLU(), torch.ones(2), options=options).random_seed
             for _ in range(3)}
    assert len(seeds) == 3 and options.random_seed is None


def test_save_to_in_options(tmp_path: Path) -> None:
    pytest.importorskip("h5py")
    options = LogOptions(save_to=str(tmp_path / "run.h5"), random_seed=0)
    torchlog.log_forward_pass(nn.ReLU(), -torch.ones(2), options=options)
    assert torchlog.load(tmp_path / "run.h5")["relu_1_1"].tensor_contents.tolist() == [0.0, 0.0]
    again = dataclasses.replace(options, overwrite=True)
    torchlog.log_forward_pass(nn.ReLU(), torch.ones(2), options=again)
    assert torchlog.load(tmp_path / "run.h5")["relu_1_1"].tensor_contents.tolist() == [1.0, 1.0]


def test_merge_splits_rendering_keywords_and_refuses_unknown_ones() -> None:
    merged, render = merge_options(None, {"random_seed": 4, "vis_opt": "rolled"})
    assert merged == LogOptions(random_seed=4) and render == {"vis_opt": "rolled"}
    with pytest.raises(InvalidArgumentTypeError, match="'layers_to_keep'.*layers_to_save.*vis_opt"):
        merge_options(None, {"layers_to_keep": "all"})


def test_options_of_a_wrong_type_are_refused() -> None:
    with pytest.raises(InvalidArgumentTypeError, match=r"torchlog.LogOptions or None, got \{'random_seed': 1\}"):
        torchlog.log_forward_pass(nn.ReLU(), torch.ones(2), options={"random_seed": 1})
    with pytest.raises(TypeError):  # options are keywords, never a fourth positional argument
        torchlog.log_forward_pass(nn.ReLU(), torch.ones(2), None, "all")  # type: ignore[misc]


@pytest.mark.parametrize("good, bad", [
    ({"layers_to_save": 1}, {"layers_to_save": True}),  # True == 1 and hashes alike
    ({"layers_to_save": (1, 1)}, {"layers_to_save": (1, True)}),  # and inside a tuple
    ({"random_seed": 1}, {"random_seed": 1.0}),
])
def test_keywords_are_checked_on_every_call_after_an_equal_value_passed(good, bad) -> None:
    """Checked options are reused for a repeated set of keywords; a value that only
    compares equal to an accepted one must still be refused."""
    for _ in range(2):
        merged, _ = merge_options(None, good)
        assert all(getattr(merged, name) == value for name, value in good.items())
        with pytest.raises(InvalidArgumentTypeError):
            merge_options(None, bad)
    first, _ = merge_options(None, {"layers_to_save": "all"})
    assert merge_options(None, {"layers_to_save": "all"})[0] == first
