"""Every tutorial in tutorials/ runs to the end: scripts in a subprocess, notebooks with nbclient,
each with `torchlog.lint` on every history it builds in its own process or kernel."""
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


# Run in the tutorial's process or kernel before it: lint every history it builds
# (tests/invariants.py), leaving its sys.path as it was.
LINT_BEFORE = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from tests.invariants import lint_from_now_on; "
               f"sys.path.remove({str(ROOT)!r}); lint_from_now_on()")
# ... and after it: fail on a LintError the tutorial caught, else say how many histories were linted.
LINT_AFTER = "import sys; from tests.invariants import lint_summary; print(lint_summary(), file=sys.stderr)"
LINTED = re.compile(r"^torchlog\.lint checked (\d+) histories", re.M)


def _run_script(path: Path, workdir: Path) -> int:
    """Run the script `path` as `python path` would, linted; returns the number of histories linted."""
    runner = "\n".join([LINT_BEFORE, "import runpy", f"sys.argv = [{str(path)!r}]",
                        f"sys.path[0] = {str(path.parent)!r}",
                        f"runpy.run_path({str(path)!r}, run_name='__main__')", LINT_AFTER])
    env = dict(os.environ, TRANSFORMERS_VERBOSITY="error", MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, "-c", runner], cwd=workdir, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, f"{path.name} exited {done.returncode}:\n{done.stderr[-4000:]}"
    assert done.stdout.strip(), f"{path.name} printed nothing; tutorials show their results"
    linted = LINTED.findall(done.stderr)
    assert linted, f"{path.name}: no lint summary on stderr:\n{done.stderr[-2000:]}"
    return int(linted[-1])


def _run_notebook(path: Path, workdir: Path) -> int:
    """Run the notebook `path` in a fresh kernel, linted; returns the number of histories linted."""
    import nbclient  # dev extra; a missing one is an error, not a skip
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    notebook.cells.insert(0, nbformat.v4.new_code_cell(LINT_BEFORE))
    notebook.cells.append(nbformat.v4.new_code_cell(LINT_AFTER))
    client = nbclient.NotebookClient(notebook, timeout=TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(workdir)}})
    client.execute()  # raises CellExecutionError naming the cell and its traceback
    said = "".join(o.get("text", "") for o in notebook.cells[-1].outputs)
    linted = LINTED.findall(said)
    assert linted, f"{path.name}: the last cell printed no lint summary: {said!r}"
    return int(linted[-1])


def _run(path: Path, workdir: Path) -> int:
    return (_run_notebook if path.suffix == ".ipynb" else _run_script)(path, workdir)


@pytest.mark.heavy
@pytest.mark.parametrize("path", FOUND, ids=lambda p: p.name)
def test_tutorial_runs(path: Path, tmp_path: Path):
    # Run from an empty folder so tutorials that write files leave nothing in the repo.
    assert _run(path, tmp_path) > 0, f"{path.name} built no ModelHistory, or the lint hook missed them"


# A tutorial that builds a history with its passes reversed: lint must stop it.
BROKEN = """\
import torch, torchlog
from torchlog.history import ModelHistory

history = torchlog.log_forward_pass(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()), torch.ones(1, 2))
print(history)
"""
REVERSED = "ModelHistory(list(reversed(history)), history.layers, history.modules, history.info)"


def test_a_tutorial_script_that_builds_a_broken_history_fails_naming_it(tmp_path: Path) -> None:
    script = tmp_path / "broken.py"
    script.write_text(BROKEN + REVERSED + "\n")
    with pytest.raises(AssertionError, match="exited 1") as info:
        _run_script(script, tmp_path)
    assert "LintError" in str(info.value) and "not in execution order" in str(info.value)
    assert "ModelHistory of Sequential" in str(info.value)


def test_a_tutorial_script_that_catches_a_lint_error_still_fails(tmp_path: Path) -> None:
    script = tmp_path / "caught.py"
    script.write_text(BROKEN + f"try:\n    {REVERSED}\nexcept AssertionError:\n    print('caught')\n")
    with pytest.raises(AssertionError, match="exited 1") as info:
        _run_script(script, tmp_path)
    assert "a LintError was caught" in str(info.value)
    assert "ModelHistory of Sequential: the history breaks" in str(info.value)


def test_a_tutorial_notebook_that_builds_a_broken_history_fails_naming_it(tmp_path: Path) -> None:
    import nbclient
    import nbformat

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(BROKEN),
                                               nbformat.v4.new_code_cell(REVERSED)])
    path = tmp_path / "broken.ipynb"
    nbformat.write(notebook, path)
    with pytest.raises(nbclient.exceptions.CellExecutionError) as info:
        _run_notebook(path, tmp_path)
    assert "LintError" in str(info.value) and "not in execution order" in str(info.value)
    assert "ModelHistory of Sequential" in str(info.value)

