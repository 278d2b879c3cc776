"""Every bad input across the public API: a torchlog error that is also the matching builtin,
a message showing the bad value with repr and what is accepted, and no state left behind."""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import torchlog
import torchlog.storage  # the file rows use torchlog.storage.load
from tests.models import SimpleRecurrent
from tests.state_snapshot import differences, take
from torchlog.errors import (
    InvalidArgumentTypeError,
    InvalidOptionError,
    LayerNotFoundError,
    LogFileError,
    LogFileExistsError,
    LogFileNotFoundError,
    ModelInputError,
    TorchlogError,
)


@dataclass
class Ctx:
    """What a row may use: a model, its input, histories of it, and an empty folder."""

    model: nn.Module
    x: torch.Tensor
    history: torchlog.ModelHistory
    recurrent: torchlog.ModelHistory
    folder: Path

    def log(self, **kwargs: Any) -> torchlog.ModelHistory:
        return torchlog.log_forward_pass(self.model, self.x, **kwargs)


class TwoInputs(nn.Module):
    def forward(self, a, b):
        return a + b


class KeywordInput(nn.Module):
    def forward(self, a, *, scale):
        return a * scale


def _meta_model() -> nn.Module:
    with torch.device("meta"):
        return nn.Linear(4, 4)


def _not_a_log(folder: Path) -> str:
    path = folder / "notes.h5"
    path.write_text("just some text, not HDF5")
    return str(path)


def _existing(folder: Path) -> str:
    path = folder / "taken.h5"
    path.write_bytes(b"")
    return str(path)


def _lambda_model(x):
    return x


# (id, call, error class, builtin, repr of the bad value in the message, what is accepted)
Row = tuple[str, Callable[[Ctx], Any], type, type, Callable[[Ctx], str], str]
ROWS: list[Row] = [
    # --- the model
    ("model is a function", lambda c: torchlog.log_forward_pass(_lambda_model, c.x),
     InvalidArgumentTypeError, TypeError, lambda c: repr(_lambda_model), "torch.nn.Module"),
    ("model is None", lambda c: torchlog.log_forward_pass(None, c.x),
     InvalidArgumentTypeError, TypeError, lambda c: "None", "torch.nn.Module"),
    ("model is a class", lambda c: torchlog.log_forward_pass(nn.Linear, c.x),
     InvalidArgumentTypeError, TypeError, lambda c: repr(nn.Linear), "torch.nn.Module"),
    ("model on the meta device", lambda c: torchlog.log_forward_pass(_meta_model(), c.x),
     ModelInputError, TypeError, lambda c: "'weight'", "to_empty"),
    # --- inputs
    ("input_args is None", lambda c: torchlog.log_forward_pass(c.model, None),
     ModelInputError, TypeError, lambda c: "None", "pass a tensor"),
    ("input is a str", lambda c: torchlog.log_forward_pass(c.model, "four numbers"),
     ModelInputError, TypeError, lambda c: "'four numbers'", "Pass tensors"),
    ("input is a numpy array", lambda c: torchlog.log_forward_pass(c.model, np.ones((2, 4))),
     ModelInputError, TypeError, lambda c: "array([[1., 1.", "Pass tensors"),
    ("too many inputs", lambda c: torchlog.log_forward_pass(TwoInputs(), [c.x, c.x, c.x]),
     ModelInputError, TypeError, lambda c: "3 positional", "forward(a, b)"),
    ("too few inputs", lambda c: torchlog.log_forward_pass(TwoInputs(), c.x),
     ModelInputError, TypeError, lambda c: "1 positional", "forward(a, b)"),
    ("required keyword-only input missing", lambda c: torchlog.log_forward_pass(KeywordInput(), c.x),
     ModelInputError, TypeError, lambda c: "'scale'", "forward(a, scale)"),
    ("input_kwargs not a dict", lambda c: torchlog.log_forward_pass(TwoInputs(), [c.x], [("b", c.x)]),
     InvalidArgumentTypeError, TypeError, lambda c: "[('b', tensor(", "dict"),
    ("unknown input_kwargs key", lambda c: torchlog.log_forward_pass(TwoInputs(), [c.x], {"c": c.x}),
     ModelInputError, TypeError, lambda c: "['c']", "forward(a, b)"),
    # --- layers_to_save
    ("layers_to_save is a float", lambda c: c.log(layers_to_save=2.5),
     InvalidArgumentTypeError, TypeError, lambda c: "2.5", "'all'"),
    ("layers_to_save is True", lambda c: c.log(layers_to_save=True),
     InvalidArgumentTypeError, TypeError, lambda c: "True", "'all'"),
    ("layers_to_save is empty", lambda c: c.log(layers_to_save=[]),
     InvalidOptionError, ValueError, lambda c: "[]", "None to save no activations"),
    ("layers_to_save unknown label", lambda c: c.log(layers_to_save=["conv2d_9_9"]),
     InvalidOptionError, ValueError, lambda c: "'conv2d_9_9'", "module addresses"),
    ("layers_to_save position out of range", lambda c: c.log(layers_to_save=[50]),
     InvalidOptionError, ValueError, lambda c: "50", "int positions"),
    ("layers_to_save entry is a float", lambda c: c.log(layers_to_save=["0", 1.5]),
     InvalidArgumentTypeError, TypeError, lambda c: "1.5", "entries are str or int"),
    ("layers_to_save entry is empty", lambda c: c.log(layers_to_save=[""]),
     InvalidOptionError, ValueError, lambda c: "''", "layer labels"),
    # --- flags and options
    ("keep_unsaved_layers is a str", lambda c: c.log(keep_unsaved_layers="yes"),
     InvalidArgumentTypeError, TypeError, lambda c: "'yes'", "True or False"),
    ("detach_saved_tensors is 1", lambda c: c.log(detach_saved_tensors=1),
     InvalidArgumentTypeError, TypeError, lambda c: "1", "True or False"),
    ("save_function_args is None", lambda c: c.log(save_function_args=None),
     InvalidArgumentTypeError, TypeError, lambda c: "None", "True or False"),
    ("random_seed negative", lambda c: c.log(random_seed=-1),
     InvalidOptionError, ValueError, lambda c: "-1", "[0, 2**63)"),
    ("random_seed not an int", lambda c: c.log(random_seed=1.5),
     InvalidArgumentTypeError, TypeError, lambda c: "1.5", "an int in [0, 2**63)"),
    ("random_seed is a str", lambda c: c.log(random_seed="7"),
     InvalidArgumentTypeError, TypeError, lambda c: "'7'", "an int in [0, 2**63)"),
    ("activation_postfunc not callable", lambda c: c.log(activation_postfunc=3),
     InvalidArgumentTypeError, TypeError, lambda c: "3", "callable"),
    ("on_error unknown", lambda c: c.log(on_error="ignore"),
     InvalidOptionError, ValueError, lambda c: "'ignore'", "'raise', 'return'"),
    ("output_device unknown", lambda c: c.log(output_device="gpu"),
     InvalidOptionError, ValueError, lambda c: "'gpu'", "'same'"),
    ("output_device meta", lambda c: c.log(output_device="meta"),
     InvalidOptionError, ValueError, lambda c: "'meta'", "'cpu'"),
    ("output_device a float", lambda c: c.log(output_device=1.5),
     InvalidArgumentTypeError, TypeError, lambda c: "1.5", "'cpu'"),
    ("unknown keyword", lambda c: c.log(layers_to_keep="all"),
     InvalidArgumentTypeError, TypeError, lambda c: "'layers_to_keep'", "vis_opt"),
    # --- rendering options (torchlog.vis)
    ("vis_opt unknown", lambda c: c.log(vis_opt="sideways"),
     InvalidOptionError, ValueError, lambda c: "'sideways'", "'unrolled'"),
    ("vis_nesting_depth negative", lambda c: c.log(vis_opt="rolled", vis_nesting_depth=-1),
     InvalidOptionError, ValueError, lambda c: "-1", ">= 1"),
    ("vis_nesting_depth not an int", lambda c: c.log(vis_opt="rolled", vis_nesting_depth=1.5),
     InvalidArgumentTypeError, TypeError, lambda c: "1.5", "an int >= 1"),
    ("vis_fileformat unknown", lambda c: c.log(vis_opt="unrolled", vis_fileformat="docx"),
     InvalidOptionError, ValueError, lambda c: "'docx'", "'svg'"),
    ("vis_direction unknown", lambda c: c.log(vis_opt="unrolled", vis_direction="up"),
     InvalidOptionError, ValueError, lambda c: "'up'", "'topdown'"),
    ("vis_outpath folder missing",
     lambda c: c.log(vis_opt="unrolled", vis_outpath=str(c.folder / "missing" / "graph")),
     LogFileNotFoundError, FileNotFoundError, lambda c: repr(str(c.folder / "missing")), "create it"),
    ("to_dot mode unknown", lambda c: c.history.to_dot(mode="sideways"),
     InvalidOptionError, ValueError, lambda c: "'sideways'", "'rolled'"),
    ("to_dot nesting_depth zero", lambda c: c.history.to_dot(nesting_depth=0),
     InvalidOptionError, ValueError, lambda c: "0", ">= 1"),
    ("to_dot unknown option", lambda c: c.history.to_dot(colour="red"),
     InvalidArgumentTypeError, TypeError, lambda c: "'colour'", "nesting_depth"),
    ("render_graph folder missing",
     lambda c: c.history.render_graph(outpath=str(c.folder / "missing" / "graph")),
     LogFileNotFoundError, FileNotFoundError, lambda c: repr(str(c.folder / "missing")), "create it"),
    # --- lookup
    ("unknown layer key", lambda c: c.history["conv2d_1_1"],
     LayerNotFoundError, KeyError, lambda c: "'conv2d_1_1'", "a short label"),
    ("position out of range", lambda c: c.history[99],
     LayerNotFoundError, KeyError, lambda c: "99", "-4..3"),
    ("negative position out of range", lambda c: c.history[-5],
     LayerNotFoundError, KeyError, lambda c: "-5", "-4..3"),
    ("key of a wrong type", lambda c: c.history[1.5],
     InvalidArgumentTypeError, TypeError, lambda c: "1.5", "an int position"),
    ("pass number out of range", lambda c: c.recurrent["linear_1_1:5"],
     LayerNotFoundError, KeyError, lambda c: "'linear_1_1:5'", "passes 1..4"),
    ("pass number zero", lambda c: c.recurrent["linear_1_1:0"],
     LayerNotFoundError, KeyError, lambda c: "'linear_1_1:0'", "passes 1..4"),
    ("layer() unknown key", lambda c: c.history.layer("linear_9"),
     LayerNotFoundError, KeyError, lambda c: "'linear_9'", "closest labels: linear_1"),
    ("layer pass number out of range", lambda c: c.recurrent.layer("linear_1_1")[5],
     LayerNotFoundError, KeyError, lambda c: "5", "1..4"),
    # --- files (torchlog.storage)
    ("load a missing file", lambda c: torchlog.storage.load(str(c.folder / "absent.h5")),
     LogFileNotFoundError, FileNotFoundError, lambda c: repr(str(c.folder / "absent.h5")), "does not exist"),
    ("load a file that is not a log", lambda c: torchlog.storage.load(_not_a_log(c.folder)),
     LogFileError, ValueError, lambda c: repr(str(c.folder / "notes.h5")), "log"),
    ("load a path of a wrong type", lambda c: torchlog.storage.load(123),
     InvalidArgumentTypeError, TypeError, lambda c: "123", "str or os.PathLike"),
    ("save into a missing folder", lambda c: c.history.save(str(c.folder / "missing" / "run.h5")),
     LogFileNotFoundError, FileNotFoundError, lambda c: "missing", "folder"),
    ("save over an existing file", lambda c: c.history.save(_existing(c.folder)),
     LogFileExistsError, FileExistsError, lambda c: repr(str(c.folder / "taken.h5")), "overwrite"),
    ("save_to a missing folder", lambda c: c.log(save_to=str(c.folder / "missing" / "run.h5")),
     LogFileNotFoundError, FileNotFoundError, lambda c: "missing", "folder"),
]


@pytest.fixture
def ctx(tmp_path: Path) -> Ctx:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    x = torch.rand(2, 4)
    history = torchlog.log_forward_pass(model, x)
    recurrent = torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(6, 5))
    return Ctx(model, x, history, recurrent, tmp_path)


def test_the_table_is_large_and_covers_every_builtin():
    assert len(ROWS) >= 30
    assert len({row[0] for row in ROWS}) == len(ROWS)
    assert {row[3] for row in ROWS} >= {TypeError, ValueError, KeyError, FileNotFoundError}


@pytest.mark.parametrize("row", ROWS, ids=[row[0] for row in ROWS])
def test_bad_input_gets_a_clear_error_and_leaves_no_state(row, ctx):
    _, call, error, builtin, shown, accepted = row
    assert issubclass(error, TorchlogError) and issubclass(error, builtin)
    files_before = sorted(os.listdir(ctx.folder))
    before = take(ctx.model)
    with pytest.raises(error) as info:
        call(ctx)
    message = str(info.value)
    assert isinstance(info.value, builtin)
    assert shown(ctx) in message, message
    assert accepted in message, message
    assert differences(before, take(ctx.model)) == []
    created = sorted(set(os.listdir(ctx.folder)) - set(files_before) - {"notes.h5", "taken.h5"})
    assert created == []


class FirstOpTypeBug(nn.Module):
    """Its first op is called wrongly whatever the input: the model's bug, not the input's."""

    def forward(self, x):
        return torch.cat(x, x)


class TakesNumbers(nn.Module):
    """Takes token ids as a list of ints and a float scale: non-tensor inputs it can take."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 3)

    def forward(self, ids, scale: float = 1.0):
        return self.embed(torch.tensor(ids)) * scale


def test_input_error_chains_the_original_type_error():
    model = nn.Linear(4, 4)
    with pytest.raises(ModelInputError) as info:
        torchlog.log_forward_pass(model, "four numbers")
    cause = info.value.__cause__
    assert type(cause) is TypeError and str(cause) in str(info.value)


def test_a_type_error_of_the_model_itself_is_kept():
    with pytest.raises(TypeError) as info:
        torchlog.log_forward_pass(FirstOpTypeBug(), torch.ones(2))
    assert type(info.value) is TypeError  # not turned into ModelInputError: inputs are tensors
    assert "'cat'" in info.value.__notes__[0] or "cat" in str(info.value)
    assert info.value.torchlog_history.layer_labels == ["input_1_0"]


def test_non_tensor_inputs_the_model_can_take_are_accepted():
    torch.manual_seed(0)
    model = TakesNumbers()
    history = torchlog.log_forward_pass(model, [[1, 2, 3]], input_kwargs={"scale": 2.0})
    assert torch.equal(history[-1].tensor_contents, model([1, 2, 3], scale=2.0))
    assert [p.layer_type for p in history][:2] == ["tensor", "embedding"]
