"""The suite runs where another installed distribution ships a top-level `tests` package
(torchvista 0.2.13 does), here a decoy first on PYTHONPATH: the lint plugin loads under its own
name (torchlog_lint_plugin.py), `from tests.models import ...` and the plugin's import of
`tests.invariants` find this checkout's tests/ (a regular package, first on sys.path through
setup.cfg's `pythonpath`), and the histories that tests and docstring examples build are linted."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# A docstring example outside the checkout: only setup.cfg's `-p` can bring the plugin to it.
EXAMPLE = '''"""A docstring example that builds a history."""


def logged():
    """
    >>> import torch, torchlog
    >>> torchlog.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2))  # doctest: +ELLIPSIS
    <ModelHistory of Linear: ...>
    """
'''


def _decoy_env(tmp_path: Path) -> dict[str, str]:
    """The environment with a package named `tests` (not this checkout's) first on PYTHONPATH."""
    package = tmp_path / "decoy" / "tests"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""Another distribution\'s tests."""\n')
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path / "decoy"), env.get("PYTHONPATH")) if p)
    return env


def test_the_decoy_is_the_tests_package_that_python_imports_outside_the_checkout(tmp_path: Path) -> None:
    """Where the checkout is not first on sys.path, `import tests` finds the decoy: the environment
    of the tests below does hold another `tests` package."""
    env = _decoy_env(tmp_path)
    done = subprocess.run([sys.executable, "-c", "import tests; print(tests.__file__)"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == tmp_path / "decoy" / "tests" / "__init__.py", done.stdout


# `python -m pytest` puts the working folder first on sys.path; the `pytest` script puts its own.
LAUNCHERS = {"python -m pytest": [sys.executable, "-m", "pytest"],
             "pytest script": [str(Path(sys.executable).parent / "pytest")]}


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_test_file_and_a_docstring_example_pass_with_a_decoy_tests_package_first(
        launcher: str, tmp_path: Path) -> None:
    env = _decoy_env(tmp_path)
    (tmp_path / "examples.py").write_text(EXAMPLE)
    test_file = ROOT / "tests" / "torchlog" / "test_invariants.py"  # imports tests.models, builds histories
    done = subprocess.run([*LAUNCHERS[launcher], "-p", "no:cacheprovider", "-rA",
                           str(test_file), str(tmp_path / "examples.py")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert "Error importing plugin" not in out, out[-6000:]
    assert re.search(r"^PASSED \S*examples\.logged$", out, re.M), out[-6000:]
    assert re.search(r"^PASSED \S*test_invariants\.py::test_", out, re.M), out[-6000:]
    # The plugin ran and linted what the test and the example built (it imports tests.invariants).
    linted = re.search(r"^torchlog\.lint checked (\d+) histories", out, re.M)
    assert linted and int(linted.group(1)) >= 2, out[-6000:]


def test_a_docstring_example_alone_is_linted_with_a_decoy_tests_package_first(tmp_path: Path) -> None:
    """No test file is collected, so tests/conftest.py never runs: the plugin's own import of
    tests.invariants must find this checkout's tests/ (a regular package, first on sys.path)."""
    env = _decoy_env(tmp_path)
    (tmp_path / "examples.py").write_text(EXAMPLE)
    done = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "setup.cfg"), "-p", "no:cacheprovider",
                           "-rA", str(tmp_path / "examples.py")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert re.search(r"^PASSED \S*examples\.logged$", out, re.M), out[-6000:]
    assert re.search(r"^torchlog\.lint checked 1 histories", out, re.M), out[-6000:]
