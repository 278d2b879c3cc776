"""torchlog_lint_plugin.py, as setup.cfg loads it: a docstring example that builds a broken history
fails, naming the history and the broken invariant, whether it raises or catches the LintError."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = """\
    >>> import torch, torchlog
    >>> from torchlog.history import ModelHistory
    >>> history = torchlog.log_forward_pass(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()),
    ...                                     torch.ones(1, 2))
"""
REVERSED = "ModelHistory(list(reversed(history)), history.layers, history.modules, history.info)"
MODULE = f'''"""Docstring examples that build histories."""


def sound():
    """
{BUILD}    >>> history  # doctest: +ELLIPSIS
    <ModelHistory of Sequential: ...>
    """


def broken():
    """
{BUILD}    >>> {REVERSED}  # doctest: +ELLIPSIS
    <ModelHistory of Sequential: ...>
    """


def caught():
    """
{BUILD}    >>> try:
    ...     {REVERSED}
    ... except AssertionError:
    ...     print("caught")
    caught
    """
'''


def test_a_docstring_example_that_builds_a_broken_history_fails_naming_it(tmp_path: Path) -> None:
    (tmp_path / "examples.py").write_text(MODULE)
    # setup.cfg as the ini file: its addopts (--doctest-modules, -p torchlog_lint_plugin) and pythonpath.
    done = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "setup.cfg"), "-p", "no:cacheprovider",
                           "-rA", "examples.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    outcomes = set(re.findall(r"^(PASSED|FAILED|ERROR) \S*examples\.(\w+)\b", out, re.M))
    # `caught` passes its call, then fails at teardown.
    assert outcomes == {("PASSED", "sound"), ("FAILED", "broken"), ("PASSED", "caught"), ("ERROR", "caught")}, (
        out[-6000:])
    broken = out.split("examples.broken", 1)[1]
    assert re.search(r"LintError: the history breaks \d+ invariant", broken), out[-6000:]
    assert "passes are not in execution order" in broken, out[-6000:]
    assert "torchlog.lint of the ModelHistory of Sequential just built" in broken, out[-6000:]
    assert re.search(r"caught before it could fail the test:\s+ModelHistory of Sequential: the history breaks",
                     out), out[-6000:]
    assert re.search(r"^torchlog\.lint checked \d+ histories", out, re.M), out[-6000:]
