"""The pytest plugin that lints every ModelHistory built while a test or a docstring example runs.

setup.cfg's addopts load it (`-p torchlog_lint_plugin`), so it reaches the doctests of `torchlog/`,
`vis/` and `storage/` as well as the tests; tests/conftest.py names it too, so that a run that
overrides addopts still lints the tests. It sits at the top of the checkout under a name of its
own because a plugin named `tests.*` fails to load wherever another installed distribution ships
a top-level `tests` package (tests/test_decoy_tests_package.py). The tutorials run in processes
of their own: tests/test_tutorials.py lints those with `tests/invariants.py`'s `lint_from_now_on`.
"""
from __future__ import annotations

import sys

import pytest

_CALL_FAILED = pytest.StashKey[bool]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "no_lint(reason): the histories built while this test runs are not linted (a test "
        "that builds a broken history on purpose); give the reason")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    report = yield
    if report.when == "call":
        item.stash[_CALL_FAILED] = report.failed
    return report


@pytest.fixture(autouse=True)
def _lint_every_history(request: pytest.FixtureRequest):
    """Lint every ModelHistory built while the test or docstring example runs, as it is built
    (tests/invariants.py's `linting`): those log_forward_pass, load and replay return, and
    torchlog's internal ones. A failure raises LintError there; one caught on its way out (by
    torchlog or the test) still fails the test here. `@pytest.mark.no_lint('why')` opts a test
    out; a docstring example has no marker, and no reason to build a broken history."""
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
        terminalreporter.write_line(invariants.tally_line())
