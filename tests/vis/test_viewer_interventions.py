"""The viewer's panel for an intervened pass: the action, and each statistic of the value before
the action beside the value the pass kept, checked against torchlog.statistics on a plain
forward's value (headless Chromium)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlog
from tests.vis.browser import open_page, start_browser, wait_for
from torchlog.interventions import scale
from torchlog.statistics import summarize
from torchlog.vis.viewer.data import page_data

pytestmark = pytest.mark.browser


def _run() -> tuple[nn.Module, torch.Tensor, torchlog.ModelHistory]:
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)), torch.randn(5, 4)
    return model, x, torchlog.log_forward_pass(model, x, intervene={"relu_1_2": scale(-2.0)})


def test_page_data_carries_the_before_summary_of_the_intervened_pass_only() -> None:
    model, x, history = _run()
    passes = {p["label"]: p for p in page_data(history, "unrolled", None)["passes"]}
    with torch.no_grad():
        want = summarize(torch.relu(model[0](x)))
    before = passes["relu_1_2"]["before"]
    assert before["max"] == pytest.approx(want.max, rel=1e-6) and before["zeros"] == pytest.approx(want.zeros)
    assert "before" not in passes["linear_1_1"] and "before" not in passes["linear_2_3"]


def test_the_panel_sets_before_and_after_side_by_side(tmp_path) -> None:
    model, x, history = _run()
    with torch.no_grad():
        before, after = summarize(torch.relu(model[0](x))), summarize(-2.0 * torch.relu(model[0](x)))
    driver = start_browser()
    try:
        open_page(driver, history.to_html(tmp_path / "acted.html"))
        driver.find_element("css selector", '[data-label="relu_1_2"]').click()
        wait_for(driver, "return document.querySelector('#torchlog-before-after') !== null")
        table = driver.execute_script(
            "const out = {}; document.querySelectorAll('#torchlog-before-after tr').forEach(tr => {"
            "  const [k, b, a] = [...tr.querySelectorAll('td')].map(td => td.textContent); out[k] = [b, a]; });"
            "return out;")
        rows = driver.execute_script(
            "const out = {}; document.querySelectorAll('#torchlog-panel > table tr').forEach(tr => {"
            "  const [k, v] = tr.querySelectorAll('td'); out[k.textContent] = v.textContent; }); return out;")
    finally:
        driver.quit()
    assert table[""] == ["before", "after"]
    for name in ("min", "max", "mean", "std"):
        assert float(table[name][0]) == pytest.approx(getattr(before, name), rel=1e-4, abs=1e-6), name
        assert float(table[name][1]) == pytest.approx(getattr(after, name), rel=1e-4, abs=1e-6), name
    assert table["elements"] == ["30", "30"]
    assert rows["intervened"].startswith("scale(k=-2.0) at site 'relu_1_2', max |change| ")


def test_a_collapsed_module_holding_an_intervention_says_so(tmp_path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 6), nn.ReLU()), nn.Linear(6, 2))
    history = torchlog.log_forward_pass(model, torch.randn(5, 4), intervene={"relu_1_2": scale(-2.0)})
    inside = [r.label for r in history if r.extra.get("interventions")]
    assert inside == ["relu_1_2"] and "0:1" in history["relu_1_2"].containing_modules
    driver = start_browser()
    try:
        open_page(driver, history.to_html(tmp_path / "acted.html", depth=1))
        found = driver.execute_script(
            "return [...document.querySelectorAll('#torchlog-graph g.node[data-module]')]"
            ".map(g => [g.dataset.module, g.dataset.intervened || null, g.textContent,"
            " g.querySelector('polygon').getAttribute('stroke')])")
        marks = {module: (count, text, stroke) for module, count, text, stroke in found}
        assert marks["0"][0] == "1" and "intervened: 1 pass inside" in marks["0"][1]
        assert marks["0"][2].lower() == "#b35900" and marks["1"][0] is None
    finally:
        driver.quit()
