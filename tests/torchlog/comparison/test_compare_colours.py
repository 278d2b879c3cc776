"""Comparison.to_html in headless Chromium: nodes are coloured by how far outside its tolerance
each pass is, so a `match` row stays at the scale's neutral start however close its relative
difference comes to that of a row that differs; values checked against plain PyTorch."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import torchlog
from tests.torchlog.comparison.test_compare_panel import over_tolerance
from tests.vis.browser import open_page, start_browser
from torchlog.comparison.rows import Status

pytestmark = pytest.mark.browser

RTOL, ATOL = 1e-2, 1e-4
NEUTRAL = "#fff7ec"  # the sequential scale's start: what 0 is drawn in


def _runs() -> tuple[torchlog.ModelHistory, torchlog.ModelHistory]:
    """Run b scales the first Linear's weight by 1.008 (within rtol 1e-2) and shifts the last
    one's (outside it): the matching rows' relative L2 is a good part of the differing one's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4))
    changed = copy.deepcopy(model)
    with torch.no_grad():
        changed[0].weight.mul_(1.008)
        changed[4].weight.add_(0.01)
    x = torch.randn(6, 8)
    return torchlog.log_forward_pass(model, x), torchlog.log_forward_pass(changed, x)


def test_match_rows_stay_neutral_and_differing_rows_take_their_distance_from_tolerance(tmp_path) -> None:
    a, b = _runs()
    comparison = torchlog.compare(a, b, rtol=RTOL, atol=ATOL)
    status = {row.label_a: row.status for row in comparison}
    matching = [label for label, s in status.items() if s is Status.MATCH and a[label].func_name != "input"]
    differing = [label for label, s in status.items() if s is Status.DIFFERS]
    rel_l2 = {row.label_a: row.rel_l2 for row in comparison}
    assert matching and differing
    assert max(rel_l2[label] for label in matching) > 0.1 * min(rel_l2[label] for label in differing)
    driver = start_browser()
    try:
        open_page(driver, comparison.to_html(str(tmp_path / "tolerance.html"), depth=5))
        drawn = driver.execute_script(
            "const out = {}; document.querySelectorAll('#torchlog-graph g.node[data-label]').forEach(g => {"
            "  out[g.dataset.label] = [g.dataset.colourValue ?? null,"
            "    g.querySelector('polygon, ellipse').getAttribute('fill')]; }); return out;")
    finally:
        driver.quit()
    for label in matching:
        assert drawn[label] == ["0", NEUTRAL], label  # within tolerance: not painted
    for label in differing:
        want = over_tolerance(a[label].tensor_contents, b[label].tensor_contents, RTOL, ATOL)
        assert want > 0 and float(drawn[label][0]) == pytest.approx(want, rel=1e-4), label
        assert drawn[label][1] != NEUTRAL, label
