"""Every tutorial in tutorials/ runs to the end: scripts in a subprocess, notebooks with nbclient."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = ROOT / "tutorials"
TIMEOUT_S = 600  # per tutorial; each takes seconds on an idle machine, but CI machines are busy
FOUND = sorted(p for p in TUTORIALS.glob("*") if p.suffix in (".py", ".ipynb") and not p.name.startswith("_"))


def test_first_tutorial_exists():
    assert any(p.name.startswith("01_") for p in FOUND), f"no 01_* tutorial in {TUTORIALS}"


def test_tutorials_are_numbered_in_the_reading_order_the_guide_lists():
    numbers = [p.name[:3] for p in FOUND]
    assert numbers == [f"{k:02d}_" for k in range(1, len(FOUND) + 1)], (
        f"tutorials/ must be numbered 01_, 02_, ... with no gap or repeat: {[p.name for p in FOUND]}")
    page = (ROOT / "docs" / "getting-started.md").read_text()
    listed = re.findall(r"^\d+\. `tutorials/([^`]+)`", page, re.M)
    assert listed == [p.name for p in FOUND], (
        f"docs/getting-started.md lists the tutorials as {listed}, tutorials/ holds {[p.name for p in FOUND]}")


def test_every_tutorial_the_docs_name_exists():
    pages = [ROOT / "README.md", ROOT / "mkdocs.yml", *sorted((ROOT / "docs").glob("*.md"))]
    named = {(page.name, name) for page in pages for name in re.findall(r"tutorials/([\w.-]+\.\w+)", page.read_text())}
    missing = sorted((page, name) for page, name in named if not (TUTORIALS / name).is_file())
    assert not missing, f"pages name tutorials that do not exist (page, name): {missing}"
    unlinked = sorted({p.name for p in FOUND} - {name for page, name in named if page != "getting-started.md"})
    assert not unlinked, f"no guide page names these tutorials: {unlinked}"


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
