"""Test setup shared by every test file: import paths, a guard against leaked capture state, and
`torchlog.lint` on every history built while a test runs."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

# `from tests.models import ...` and `from tests.invariants import ...` work however pytest is started.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "no_lint(reason): the histories built while this test runs are not linted (a test "
        "that builds a broken history on purpose); give the reason")


@pytest.fixture(autouse=True)
def _no_leaked_capture_state():
    """Fail a test that leaves a TorchFunctionMode or logging flag behind after it ends."""
    yield
    from torchlog.capture import run

    depth = torch._C._len_torch_function_stack()
    assert depth == 0, f"{depth} TorchFunctionMode(s) still active after the test"
    assert not getattr(run._active, "recording", False), (
        "torchlog still marks this thread as recording")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    report = yield
    if report.when == "call":
        item.stash[_CALL_FAILED] = report.failed
    return report


_CALL_FAILED = pytest.StashKey[bool]()


@pytest.fixture(autouse=True)
def _lint_every_history(request: pytest.FixtureRequest):
    """Lint every ModelHistory built while the test runs, as it is built (tests/invariants.py's
    `linting`): those log_forward_pass, load and replay return, and torchlog's internal ones.
    A failure raises LintError there; one caught on its way out (by torchlog or the test) still
    fails the test here. `@pytest.mark.no_lint('why')` opts a test out."""
    marker = request.node.get_closest_marker("no_lint")
    if marker is not None:
        assert marker.args and marker.args[0], "no_lint needs a reason: @pytest.mark.no_lint('why')"
        yield
        return
    from tests.invariants import TALLY, linting
    from torchlog.history import ModelHistory

    TALLY.failures = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ModelHistory, "__init__", linting(ModelHistory.__init__))
        yield
    if TALLY.failures and not request.node.stash.get(_CALL_FAILED, False):
        pytest.fail("a LintError raised while this test ran was caught before it could fail the test:\n"
                    + "\n".join(TALLY.failures), pytrace=False)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    invariants = sys.modules.get("tests.invariants")
    if invariants is not None and invariants.TALLY.histories:
        terminalreporter.write_line(
            f"torchlog.lint checked {invariants.TALLY.histories} histories as they were built, "
            f"in {invariants.TALLY.seconds:.1f} s")
