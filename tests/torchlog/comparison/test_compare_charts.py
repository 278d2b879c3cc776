"""Comparison.to_html in headless Chromium: a compared pass's panel draws the histogram of run
b's value and of the difference a - b under their tables, beside run a's own; bin counts and
ranges checked against torch.histc on the two runs' values."""
from __future__ import annotations

import pytest
import torch

import torchlog
from tests.torchlog.comparison.test_compare_panel import port_runs
from tests.vis.browser import open_page, start_browser, wait_for
from torchlog.statistics import NUM_BINS

pytestmark = pytest.mark.browser

DIFF_TITLE = "difference a - b (float32)"
_HISTOGRAMS = """
const out = {};
document.querySelectorAll('#torchlog-panel svg.hist').forEach(svg => {
  const section = svg.closest('section.torchlog-section');
  out[section ? section.dataset.title : 'run a'] = [[...svg.querySelectorAll('rect[data-count]')].map(r => Number(r.dataset.count)),
    [...svg.querySelectorAll('text')].slice(2).map(t => t.textContent)]; });
return out;
"""


def _oracle(value: torch.Tensor) -> tuple[list[int], float, float]:
    x = value.detach().double().reshape(-1)
    lo, hi = float(x.min()), float(x.max())
    return [int(c) for c in torch.histc(x, bins=NUM_BINS, min=lo, max=hi)], lo, hi


def test_b_and_the_difference_have_histograms_beside_a(tmp_path) -> None:
    a, b = port_runs()
    page = torchlog.compare(a, b).to_html(str(tmp_path / "port.html"))
    driver = start_browser()
    try:
        open_page(driver, page)
        driver.find_element("css selector", '[data-label="linear_2_4"]').click()
        wait_for(driver, "return document.querySelector('#torchlog-panel h2')?.textContent === 'linear_2_4'", 20)
        shown = driver.execute_script(_HISTOGRAMS)
    finally:
        driver.quit()
    x, y = a["linear_2_4"].tensor_contents.detach(), b["linear_2_4"].tensor_contents.detach()
    assert set(shown) == {"run a", "run b", DIFF_TITLE}
    for title, value in (("run a", x), ("run b", y), (DIFF_TITLE, x - y)):  # the difference in float32
        counts, ticks = shown[title]
        want, lo, hi = _oracle(value)
        assert sum(counts) == sum(want) == value.numel(), title
        assert max(abs(c - w) for c, w in zip(counts, want)) <= 1, title  # a value on a bin's edge may go either way
        assert (float(ticks[0]), float(ticks[2])) == pytest.approx((lo, hi), rel=1e-4, abs=1e-7), title
