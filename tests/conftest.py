"""Test setup shared by every test file: import paths, a guard against leaked capture state, and
`torchlog.lint` on every history built while a test runs (torchlog_lint_plugin.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

# `from tests.models import ...` and `from tests.invariants import ...` work however pytest is started.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

# setup.cfg's addopts load it too (`-p`, for the doctests); named here, it still lints the tests of
# a run that overrides addopts.
pytest_plugins = ("torchlog_lint_plugin",)


@pytest.fixture(autouse=True)
def _no_leaked_capture_state():
    """Fail a test that leaves a TorchFunctionMode or logging flag behind after it ends."""
    yield
    from torchlog.capture import run

    depth = torch._C._len_torch_function_stack()
    assert depth == 0, f"{depth} TorchFunctionMode(s) still active after the test"
    assert not getattr(run._active, "recording", False), (
        "torchlog still marks this thread as recording")
