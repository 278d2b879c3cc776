"""Writing graph files with graphviz, inline display and a missing `dot` (vis/rendering.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import torchlog
from tests.models import LongChain, Nested, SimpleRecurrent
from torchlog.errors import MissingDependencyError
from torchlog.vis import GraphFile, render, to_dot
from torchlog.vis import render as render_module_function
from torchlog.vis.rendering import in_notebook

render_module = sys.modules["torchlog.vis.rendering"]


@pytest.fixture(scope="module")
def recurrent() -> torchlog.ModelHistory:
    torch.manual_seed(0)
    return torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(6, 5), random_seed=0)


@pytest.mark.needs_dot
@pytest.mark.parametrize("fileformat, magic", [("pdf", b"%PDF"), ("png", b"\x89PNG"),
                                               ("svg", b"<?xml")])
def test_render_writes_the_file_and_returns_its_path(recurrent, tmp_path: Path, fileformat: str,
                                                     magic: bytes) -> None:
    result = recurrent.render_graph(outpath=str(tmp_path / "graph"), fileformat=fileformat)
    assert isinstance(result, GraphFile) and isinstance(result, str)
    assert result == str(tmp_path / f"graph.{fileformat}")
    assert Path(result).read_bytes().startswith(magic)
    assert result.source == recurrent.to_dot()


@pytest.mark.needs_dot
def test_rolled_render_draws_five_nodes(recurrent, tmp_path: Path) -> None:
    result = render(recurrent, mode="rolled", outpath=tmp_path / "rolled.svg")
    svg = Path(result).read_text()
    assert svg.count('class="node"') == 5
    for title in ("linear_1_1 (x4)", "add_1_2 (x4)", "mul_1_3 (x4)", "In 2&#45;4", "Out 1&#45;3"):
        assert title in svg


@pytest.mark.needs_dot
def test_log_forward_pass_renders_after_logging(tmp_path: Path) -> None:
    out = tmp_path / "nested"
    history = torchlog.log_forward_pass(Nested(), torch.rand(2, 4), vis_opt="rolled",
                                        vis_nesting_depth=1, vis_outpath=str(out),
                                        vis_fileformat="svg")
    svg = (tmp_path / "nested.svg").read_text()
    assert "block1 (Middle)" in svg and "linear_1_1" not in svg
    assert isinstance(history, torchlog.ModelHistory)


@pytest.mark.needs_dot
def test_default_output_is_a_pdf_in_the_working_folder(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    torchlog.log_forward_pass(nn.Linear(2, 2), torch.rand(1, 2), vis_opt="unrolled")
    assert [p.name for p in tmp_path.iterdir()] == ["graph.pdf"]
    assert (tmp_path / "graph.pdf").read_bytes().startswith(b"%PDF")


@pytest.mark.needs_dot
def test_graph_file_displays_inline_as_svg(recurrent, tmp_path: Path) -> None:
    result = recurrent.render_graph(outpath=tmp_path / "g.pdf")
    bundle = result._repr_mimebundle_()
    assert "<svg" in bundle["image/svg+xml"]
    assert "linear_1_1:4" in bundle["image/svg+xml"]


@pytest.mark.needs_dot
def test_display_option_shows_the_graph_in_a_notebook(recurrent, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("IPython")
    import IPython.display

    shown = []
    monkeypatch.setattr(render_module, "in_notebook", lambda: True)
    monkeypatch.setattr(IPython.display, "display", shown.append)
    recurrent.render_graph(outpath=tmp_path / "g.svg", display=False)
    assert shown == []
    result = recurrent.render_graph(outpath=tmp_path / "g.svg", display=True)
    assert shown == [result]


def test_not_in_notebook_in_a_test_run() -> None:
    assert in_notebook() is False


@pytest.mark.needs_dot
def test_two_thousand_nodes_render_to_svg(tmp_path: Path) -> None:
    history = torchlog.log_forward_pass(LongChain(), torch.rand(1, 2), layers_to_save=None, random_seed=0)
    assert len(history) >= 2000
    result = history.render_graph(outpath=tmp_path / "long.svg")
    assert Path(result).read_text().count('class="node"') == len(history)


def test_gv_format_writes_the_source_without_dot(recurrent, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` on this PATH
    result = recurrent.render_graph(outpath=tmp_path / "graph", fileformat="gv")
    assert Path(result).read_text() == recurrent.to_dot()
    assert result._repr_mimebundle_() == {"text/plain": repr(str(tmp_path / "graph.gv"))}


def test_missing_dot_says_how_to_install(recurrent, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MissingDependencyError, match="apt-get install graphviz") as caught:
        recurrent.render_graph(outpath=tmp_path / "graph.png")
    assert "to_dot()" in str(caught.value)
    assert list(tmp_path.iterdir()) == []
    assert recurrent.to_dot().startswith('digraph "SimpleRecurrent"')


def test_missing_dot_fails_log_forward_pass_before_running(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    calls = []
    model = nn.Linear(2, 2)
    model.register_forward_hook(lambda *args: calls.append(1))
    with pytest.raises(MissingDependencyError, match="apt-get install graphviz"):
        torchlog.log_forward_pass(model, torch.rand(1, 2), vis_opt="unrolled",
                                  vis_outpath=str(tmp_path / "g"))
    assert calls == []


def test_dot_vanishing_during_the_run_is_reported(recurrent, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    graphviz = pytest.importorskip("graphviz")

    def no_executable(*args, **kwargs):
        raise graphviz.ExecutableNotFound(("dot", "-Tpng"))

    monkeypatch.setattr(render_module.shutil, "which", lambda name: "/usr/bin/dot")
    monkeypatch.setattr(graphviz, "pipe", no_executable)
    with pytest.raises(MissingDependencyError, match="apt-get install graphviz"):
        recurrent.render_graph(outpath=tmp_path / "graph.png")


def test_missing_graphviz_package(recurrent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "graphviz", None)  # makes `import graphviz` fail
    with pytest.raises(MissingDependencyError, match="pip install graphviz"):
        recurrent.render_graph(outpath=tmp_path / "graph.png")
    assert to_dot(recurrent, mode="rolled")


def test_import_torchlog_and_to_dot_do_not_import_graphviz() -> None:
    code = ("import sys, torch, torchlog\n"
            "h = torchlog.log_forward_pass(torch.nn.Linear(2, 2), torch.rand(1, 2))\n"
            "h.to_dot()\n"
            "assert 'graphviz' not in sys.modules, 'graphviz imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ})


def test_render_is_the_history_method(recurrent, tmp_path: Path) -> None:
    assert render_module_function is render_module.render
    path = render_module_function(recurrent, outpath=tmp_path / "x", fileformat="gv")
    assert Path(path).read_text() == recurrent.to_dot()
