"""The documentation: the site builds in strict mode, the pages' and the README quickstart's examples run
(each history they build linted by torchlog_lint_plugin.py), and every page the README links to exists."""
from __future__ import annotations

import doctest
import importlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
EXAMPLE_BLOCK = re.compile(r"^```pycon\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")  # a Markdown link's target
PAGES_WITH_EXAMPLES = sorted(p.name for p in DOCS.glob("*.md") if EXAMPLE_BLOCK.search(p.read_text()))


def _run_examples(text: str, name: str) -> tuple[doctest.TestResults, str]:
    """Run the ```pycon blocks of `text` in order, as one doctest sharing its globals."""
    source = "\n".join(EXAMPLE_BLOCK.findall(text))
    test = doctest.DocTestParser().get_doctest(source, {"__name__": name}, name, name, 0)
    report = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    return runner.run(test, out=report.write), report.getvalue()


@pytest.mark.parametrize("page", PAGES_WITH_EXAMPLES)
def test_page_examples_run(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # examples write files (run.h5, net.html) where they stand
    results, report = _run_examples((DOCS / page).read_text(), f"docs/{page}")
    assert results.attempted > 0
    assert results.failed == 0, f"docs/{page}: {results.failed} example(s) failed\n{report}"


def test_the_example_runner_reports_a_wrong_output() -> None:
    results, report = _run_examples("```pycon\n>>> 1 + 1\n3\n```\n", "wrong")
    assert (results.failed, results.attempted) == (1, 1) and "Expected" in report


def test_a_page_example_that_builds_a_broken_history_fails_naming_it() -> None:
    from tests.invariants import TALLY

    page = ("```pycon\n>>> import torch, torchlog\n>>> from torchlog.history import ModelHistory\n"
            ">>> history = torchlog.log_forward_pass(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()), "
            "torch.ones(1, 2))\n"
            ">>> ModelHistory(list(reversed(history)), history.layers, history.modules, history.info)"
            "  # doctest: +ELLIPSIS\n<ModelHistory of Sequential: ...>\n```\n")
    results, report = _run_examples(page, "broken")
    assert (results.failed, results.attempted) == (1, 4), report
    assert "LintError: the history breaks" in report and "passes are not in execution order" in report
    assert "torchlog.lint of the ModelHistory of Sequential just built" in report
    # Kept for the lint fixture's teardown, which fails a test whose LintError was caught (here by
    # the example runner, on purpose).
    assert len(TALLY.failures) == 1 and TALLY.failures[0].startswith("ModelHistory of Sequential: ")
    TALLY.failures.clear()


def test_readme_quickstart_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # it writes model.html
    text = (ROOT / "README.md").read_text()
    assert "## Quickstart" in text and EXAMPLE_BLOCK.search(text), "the README has no ```pycon quickstart"
    results, report = _run_examples(text, "README.md")
    assert results.failed == 0, f"README.md: {results.failed} example(s) failed\n{report}"


def test_every_file_the_readme_links_to_exists() -> None:
    targets = [t for t in LINK.findall((ROOT / "README.md").read_text())
               if not re.match(r"[a-z]+:", t) and not t.startswith("#")]
    assert any(t.startswith("docs/") for t in targets), "the README links to no page of docs/"
    missing = sorted({t for t in targets if not (ROOT / t.split("#")[0]).is_file()})
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_every_guide_page_is_linked_from_the_readme() -> None:
    linked = {t.split("#")[0] for t in LINK.findall((ROOT / "README.md").read_text())}
    nav = re.findall(r":\s+([\w-]+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert len(nav) >= 10, f"mkdocs.yml's nav lists too few pages: {nav}"
    unlinked = sorted(p for p in nav if f"docs/{p}" not in linked)
    assert not unlinked, f"README.md links to no page for {unlinked}"


def test_site_builds_in_strict_mode(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install torchlog[docs])")
    pytest.importorskip("mkdocstrings", reason="the docs extra is not installed (pip install torchlog[docs])")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    api = (tmp_path / "api" / "torchlog" / "index.html").read_text()
    assert 'id="torchlog.log_forward_pass"' in api, "the API page does not document log_forward_pass"
    storage = (tmp_path / "api" / "storage" / "index.html").read_text()
    assert 'id="torchlog.storage.load"' in storage, "torchlog.storage is not read from storage/"
    pages = "".join(page.read_text() for page in (tmp_path / "api").rglob("index.html"))
    for name in ("torchlog", "torchlog.interventions", "torchlog.patching", "torchlog.select",
                 "torchlog.comparison", "torchlog.export", "torchlog.storage", "torchlog.vis",
                 "torchlog.validation", "torchlog.replay"):
        module = importlib.import_module(name)
        undocumented = [n for n in module.__all__ if f'id="{name}.{n}"' not in pages]
        assert not undocumented, f"the API reference has no entry for {name}'s {undocumented} (in its __all__)"
