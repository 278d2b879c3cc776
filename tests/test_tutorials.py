"""Every tutorial in tutorials/ runs to the end: scripts in a subprocess, notebooks with nbclient."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TUTORIALS = Path(__file__).resolve().parent.parent / "tutorials"
TIMEOUT_S = 600  # per tutorial; each takes seconds on an idle machine, but CI machines are busy
FOUND = sorted(p for p in TUTORIALS.glob("*") if p.suffix in (".py", ".ipynb") and not p.name.startswith("_"))


def test_first_tutorial_exists():
    assert any(p.name.startswith("01_") for p in FOUND), f"no 01_* tutorial in {TUTORIALS}"


def _run_script(path: Path, workdir: Path) -> None:
    env = dict(os.environ, TRANSFORMERS_VERBOSITY="error", MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, str(path)], cwd=workdir, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, f"{path.name} exited {done.returncode}:\n{done.stderr[-4000:]}"
    assert done.stdout.strip(), f"{path.name} printed nothing; tutorials show their results"


def _run_notebook(path: Path, workdir: Path) -> None:
    import nbclient  # dev extra; a missing one is an error, not a skip
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(workdir)}})
    client.execute()  # raises CellExecutionError naming the cell and its traceback


@pytest.mark.heavy
@pytest.mark.parametrize("path", FOUND, ids=lambda p: p.name)
def test_tutorial_runs(path: Path, tmp_path: Path):
    # Run from an empty folder so tutorials that write files leave nothing in the repo.
    (_run_notebook if path.suffix == ".ipynb" else _run_script)(path, tmp_path)
