"""Comparison.to_html on a pair of 1,000-pass runs: the page's size, b's and the difference's
statistics for every pass, and in Chromium its colours against how far outside its tolerance
each pass is (log10 of max |a - b| / (atol + rtol max |a|), 0 within it), computed with plain
PyTorch from the two runs' saved values."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import torchlog
from tests.torchlog.comparison.test_compare_panel import check_stats, embedded_data, over_tolerance, sections_of
from torchlog.comparison.page import LEGEND

# The viewer's size budget (issue 11): the page of a 12-layer GPT-2, 555 passes with
# statistics, is at most 3 MB. A 1,000-pass comparison page of small tensors stays within it.
PAGE_BUDGET_BYTES = 3_000_000


class ScaledLoop(nn.Module):
    """A Linear and tanh stepped 500 times, the state scaled by `scale` after step `at`:
    1,003 passes. Two copies that differ only in `scale` run the same ops and part there."""

    def __init__(self, steps: int = 500, at: int = 300, scale: float = 1.0) -> None:
        super().__init__()
        self.cell = nn.Linear(4, 4)
        self.steps, self.at, self.scale = steps, at, scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for step in range(self.steps):
            x = torch.tanh(self.cell(x))
            if step == self.at:
                x = x * self.scale
        return x


@pytest.fixture(scope="module")
def runs() -> tuple[torchlog.ModelHistory, torchlog.ModelHistory]:
    torch.manual_seed(0)
    model, x = ScaledLoop(), torch.randn(2, 4)
    scaled = copy.deepcopy(model)
    scaled.scale = 1.001
    return (torchlog.log_forward_pass(model, x, random_seed=0),
            torchlog.log_forward_pass(scaled, x, random_seed=0))


def _over_tolerance(a: torchlog.ModelHistory, b: torchlog.ModelHistory) -> dict[str, float]:
    """Every pass's colour value from its saved values (the oracle; float32's tolerance)."""
    return {record.label: over_tolerance(record.tensor_contents, b[record.label].tensor_contents, 1e-5, 1e-7)
            for record in a}


def test_a_thousand_pass_comparison_page_fits_the_viewer_budget(runs, tmp_path) -> None:
    a, b = runs
    assert len(a) == len(b) == 1003
    comparison = torchlog.compare(a, b)
    assert comparison.first_divergence.label_a == "mul_1_3"
    path = tmp_path / "compare.html"
    assert comparison.to_html(str(path)) == str(path)
    text = path.read_text(encoding="utf-8")
    assert len(text.encode()) <= PAGE_BUDGET_BYTES
    assert LEGEND in text and text.count("mul_1_3") >= 1


def test_every_pass_of_the_thousand_pass_page_has_b_and_the_difference(runs, tmp_path) -> None:
    a, b = runs
    data = embedded_data(torchlog.compare(a, b).to_html(str(tmp_path / "compare.html")))
    assert set(data["sections"]["passes"]) == {record.label for record in a}
    for label in ("input_1_0", "linear_1_1:301", "mul_1_3", "tanh_1_2:500"):
        x, y = a[label].tensor_contents.detach(), b[label].tensor_contents.detach()
        tables = sections_of(data, label)
        check_stats(tables["run b"], y)
        check_stats(tables["difference a - b (float32)"], x - y)
    # Every pass ran in both: nothing marked, nothing only in b.
    assert "marks" not in data["colour"] and "notes" not in data["colour"]


@pytest.mark.browser
def test_the_thousand_pass_page_opens_coloured_by_difference(runs, tmp_path) -> None:
    from tests.vis.browser import open_page, start_browser

    a, b = runs
    oracle = _over_tolerance(a, b)
    page = torchlog.compare(a, b).to_html(str(tmp_path / "compare.html"))
    driver = start_browser()
    try:
        open_page(driver, page)
        assert driver.find_element("id", "torchlog-colour").get_attribute("value") == "custom"
        assert driver.find_element("id", "torchlog-legend").text.startswith(LEGEND)
        selected = driver.execute_script(
            "return document.querySelector('#torchlog-graph g.torchlog-selected')?.dataset.key")
        assert selected == "mul_1_3"  # opened on the first divergence
        drawn = driver.execute_script(
            "const out = {}; document.querySelectorAll('#torchlog-graph g.node').forEach(g => {"
            "  out[g.dataset.key] = [g.dataset.colourValue ?? null,"
            "    g.querySelector('polygon, ellipse').getAttribute('fill')]; });"
            "return out;")
    finally:
        driver.quit()
    # Every pass is drawn, an op or input node by its label, each module call collapsed
    # to a box taking its one op's value (the Linear of that step).
    expected = {label: oracle[label] for label in oracle if not label.startswith("linear")}
    expected.update({f"module cell:{n}": oracle[f"linear_1_1:{n}"] for n in range(1, 501)})
    assert set(drawn) == set(expected)
    for key, value in expected.items():
        assert float(drawn[key][0]) == pytest.approx(value, rel=1e-4, abs=1e-12), key
    fills = {fill for value, fill in drawn.values() if float(value) == 0.0}
    assert fills == {"#fff7ec"}  # the passes within tolerance: the scale's neutral start, unpainted
    assert sum(1 for value, _ in drawn.values() if float(value) == 0.0) >= 300
    largest = max(expected, key=expected.get)
    assert largest == "mul_1_3" and drawn[largest][1] not in fills
