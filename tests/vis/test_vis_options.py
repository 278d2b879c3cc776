"""Checking rendering options before any work (vis/options.py, options_from_keywords)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn

import torchlog
from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError, LogFileNotFoundError
from torchlog.vis import RenderOptions, options_from_keywords
from torchlog.vis.options import resolve_options


class CountsCalls(nn.Module):
    """Counts forward calls, to prove a bad option fails before the model runs."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        self.calls += 1
        return self.lin(x)


def test_defaults() -> None:
    options = RenderOptions()
    assert (options.mode, options.nesting_depth, options.rankdir, options.show_buffers) == (
        "unrolled", None, "BT", False)
    assert options.format == "pdf"


@pytest.mark.parametrize("field, value, error", [
    ("mode", "sideways", InvalidOptionError),
    ("direction", "up", InvalidOptionError),
    ("fileformat", "docx", InvalidOptionError),
    ("nesting_depth", 0, InvalidOptionError),
    ("nesting_depth", -2, InvalidOptionError),
    ("nesting_depth", 1.5, InvalidArgumentTypeError),
    ("nesting_depth", True, InvalidArgumentTypeError),
    ("nesting_depth", "2", InvalidArgumentTypeError),
    ("show_buffers", "yes", InvalidArgumentTypeError),
    ("outpath", 3, InvalidArgumentTypeError),
])
def test_bad_values_raise_naming_the_value(field: str, value, error: type) -> None:
    with pytest.raises(error) as caught:
        RenderOptions(**{field: value})
    assert repr(value) in str(caught.value) and field in str(caught.value)


def test_format_comes_from_the_suffix_unless_given(tmp_path: Path) -> None:
    assert RenderOptions(outpath=tmp_path / "g.svg").format == "svg"
    assert RenderOptions(outpath=tmp_path / "g.svg").output_path() == tmp_path / "g.svg"
    assert RenderOptions(outpath=tmp_path / "g.v2").output_path() == tmp_path / "g.v2.pdf"
    assert RenderOptions(outpath=tmp_path / "g", fileformat="png").output_path() == tmp_path / "g.png"
    assert RenderOptions(outpath=tmp_path).output_path() == tmp_path / "graph.pdf"


def test_missing_folder_is_named(tmp_path: Path) -> None:
    target = tmp_path / "nope" / "graph"
    with pytest.raises(LogFileNotFoundError, match="nope"):
        RenderOptions(outpath=target).output_path()


def test_folder_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidOptionError, match="is a file"):
        RenderOptions(outpath=tmp_path / "file" / "graph").output_path()


def test_unwritable_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests may run as root, who can write anywhere; make the check itself say no.
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path)
    with pytest.raises(InvalidOptionError, match="not writable"):
        RenderOptions(outpath=tmp_path / "graph").output_path()


def test_keywords_accept_plain_and_vis_names() -> None:
    options = resolve_options(None, {"vis_opt": "rolled", "nesting_depth": 2, "vis_direction": "topdown"})
    assert (options.mode, options.nesting_depth, options.direction) == ("rolled", 2, "topdown")
    merged = resolve_options(RenderOptions(mode="rolled", show_buffers=True), {"mode": "unrolled"})
    assert (merged.mode, merged.show_buffers) == ("unrolled", True)


def test_unknown_keyword_lists_the_accepted_ones() -> None:
    with pytest.raises(InvalidArgumentTypeError, match="vis_colour") as caught:
        resolve_options(None, {"vis_colour": "red"})
    assert "nesting_depth" in str(caught.value)
    with pytest.raises(InvalidArgumentTypeError, match="RenderOptions"):
        resolve_options({"mode": "rolled"}, {})


def test_options_from_keywords_checks_folder_and_sets_display(tmp_path: Path) -> None:
    options = options_from_keywords(vis_opt="rolled", vis_outpath=str(tmp_path / "g"),
                                    vis_fileformat="gv")
    assert (options.mode, options.display, options.format) == ("rolled", True, "gv")
    with pytest.raises(LogFileNotFoundError):
        options_from_keywords(vis_opt="rolled", vis_outpath=str(tmp_path / "missing" / "g"))


@pytest.mark.parametrize("keywords, error, shown", [
    ({"vis_opt": "fancy"}, InvalidOptionError, "'fancy'"),
    ({"vis_opt": "rolled", "vis_fileformat": "doc"}, InvalidOptionError, "'doc'"),
    ({"vis_opt": "rolled", "vis_nesting_depth": 0}, InvalidOptionError, "0"),
    ({"vis_opt": "rolled", "vis_nesting_depth": 2.0}, InvalidArgumentTypeError, "2.0"),
    ({"vis_opt": "rolled", "vis_outpath": "/no/such/folder/graph"}, LogFileNotFoundError,
     "/no/such/folder"),
])
def test_log_forward_pass_rejects_bad_options_before_running(keywords, error, shown) -> None:
    model = CountsCalls()
    with pytest.raises(error) as caught:
        torchlog.log_forward_pass(model, torch.rand(1, 2), **keywords)
    assert shown in str(caught.value)
    assert model.calls == 0


def test_vis_opt_none_renders_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    torchlog.log_forward_pass(CountsCalls(), torch.rand(1, 2), vis_opt="none")
    assert list(tmp_path.iterdir()) == []
