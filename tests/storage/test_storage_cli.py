"""Tests of storage/cli.py through `python -m torchlog show | layers | render`."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torchlog
from torchlog.__main__ import main
from torchlog.demo import DemoNet

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def log_file(tmp_path: Path) -> tuple[Path, torchlog.ModelHistory]:
    history = torchlog.log_forward_pass(DemoNet().eval(), torch.rand(1, 3, 8, 8), random_seed=0,
                                        save_to=tmp_path / "run.h5")
    return tmp_path / "run.h5", history


def test_show_prints_the_summary(log_file: tuple, capsys: pytest.CaptureFixture) -> None:
    path, history = log_file
    assert main(["show", str(path)]) == 0
    assert capsys.readouterr().out == str(history) + "\n"


def test_layers_lists_every_pass_with_shape_and_dtype(log_file: tuple, capsys: pytest.CaptureFixture) -> None:
    path, history = log_file
    assert main(["layers", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert list(rows) == history.layer_labels
    assert rows["conv2d_1_1"][1:5] == ["(1,", "8,", "8,", "8)"] and rows["conv2d_1_1"][5] == "float32"


def test_layers_lists_an_extract_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
    torchlog.extract(net, torch.rand(10, 3), ["relu_1_2"], tmp_path / "acts.h5", batch_size=4)
    assert main(["layers", str(tmp_path / "acts.h5")]) == 0
    assert "relu_1_2  (10, 4)" in capsys.readouterr().out


def test_show_warns_about_an_incomplete_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    class Fails(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) + torch.ones(2, 2) @ torch.ones(3, 3)

    with pytest.raises(RuntimeError):
        torchlog.log_forward_pass(Fails(), torch.rand(2), save_to=tmp_path / "bad.h5")
    assert main(["show", str(tmp_path / "bad.h5")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("warning: log file") and "is incomplete" in out and "(partial" in out


def test_errors_are_one_line_on_stderr_with_exit_status_1(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["show", str(tmp_path / "missing.h5")]) == 1
    assert capsys.readouterr().err == f"torchlog: error: log file '{tmp_path / 'missing.h5'}' does not exist\n"


@pytest.mark.needs_dot
@pytest.mark.parametrize("rolled", [False, True])
def test_render_writes_the_graph_of_the_log(log_file: tuple, tmp_path: Path, rolled: bool) -> None:
    path, history = log_file
    out = tmp_path / "graph.svg"
    done = subprocess.run([sys.executable, "-m", "torchlog", "render", str(path), "-o", str(out)]
                          + (["--rolled"] if rolled else []), capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert out.read_text().lstrip().startswith(("<?xml", "<svg"))
    labels_drawn = [label for label in history.layer_labels if label.split(":")[0] in out.read_text()]
    assert len(labels_drawn) >= len(history.layers) // 2
