"""Comparison.to_html in headless Chromium: the panel shows run b's statistics and those of the
difference beside run a's, checked against plain PyTorch on the two values; passes with nothing
to compare carry their mark, the legend names each mark and the passes only run b ran."""
from __future__ import annotations

from typing import Any

import pytest
import torch

import torchlog
from tests.torchlog.comparison.test_compare_panel import port_runs
from tests.vis.browser import open_page, start_browser, wait_for

pytestmark = pytest.mark.browser

_PANEL_TABLES = (
    "const out = {}; document.querySelectorAll('#torchlog-panel section.torchlog-section').forEach(s => {"
    "  const rows = {}; s.querySelectorAll('tr').forEach(tr => {"
    "    const [k, v] = tr.querySelectorAll('td'); rows[k.textContent] = v.textContent; });"
    "  out[s.dataset.title] = rows; }); return out;")
_NODES = (
    "const out = {}; document.querySelectorAll('#torchlog-graph g.node').forEach(g => {"
    "  const shape = g.querySelector('polygon, ellipse');"
    "  out[g.dataset.label] = [g.dataset.mark ?? null, shape.getAttribute('fill'),"
    "    shape.getAttribute('stroke-dasharray')]; }); return out;")


def _oracle(value: torch.Tensor) -> dict[str, float]:
    x = value.detach().double()
    return {"min": float(x.min()), "max": float(x.max()), "mean": float(x.mean()),
            "std": float(x.std(correction=0)), "elements": x.numel()}


def _check(shown: dict[str, str], value: torch.Tensor) -> None:
    """Figures as the panel prints them (five significant digits) against the oracle's."""
    for name, want in _oracle(value).items():
        assert float(shown[name]) == pytest.approx(want, rel=1e-4, abs=1e-7), name


def _rgb(hex_colour: str) -> str:
    """'#9e7bd9' as the browser writes a style's colour: 'rgb(158, 123, 217)'."""
    return "rgb({}, {}, {})".format(*(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)))


def _panel(driver: Any) -> tuple[str, dict[str, dict[str, str]]]:
    return (driver.execute_script("return document.querySelector('#torchlog-panel h2').textContent"),
            driver.execute_script(_PANEL_TABLES))


def test_the_panel_shows_b_and_the_difference_and_unmatched_nodes_are_marked(tmp_path) -> None:
    a, b = port_runs()
    page = torchlog.compare(a, b).to_html(str(tmp_path / "port.html"))
    values = {label: (a[label].tensor_contents, b[partner].tensor_contents)
              for label, partner in (("linear_1_1", "linear_1_2"), ("linear_2_4", "linear_2_4"))}
    driver = start_browser()
    try:
        open_page(driver, page)
        opened = _panel(driver)  # the page opens on the first divergence, its panel shown
        heading = driver.execute_script("return [...document.querySelectorAll('#torchlog-panel h3')]"
                                        ".map(h => h.textContent)")
        driver.find_element("css selector", '[data-label="linear_2_4"]').click()
        wait_for(driver, "return document.querySelector('#torchlog-panel h2')?.textContent === 'linear_2_4'")
        clicked = _panel(driver)
        nodes = driver.execute_script(_NODES)
        legend = driver.execute_script(
            "const l = document.getElementById('torchlog-legend');"
            "return [[...l.querySelectorAll('[data-mark]')].map(m => [m.dataset.mark, m.textContent.trim(),"
            "  m.querySelector('i').style.backgroundColor]), [...l.querySelectorAll('.note')].map(n => n.textContent)];")
        driver.execute_script("window.torchlogViewer.setColour('kind')")  # recolours the drawn nodes
        by_kind = driver.execute_script(_NODES)
    finally:
        driver.quit()
    assert heading[0] == "run a" and heading[1:4] == ["run b", "difference a - b (float32)", "comparison"]
    for (label, tables), (x, y) in zip((opened, clicked), values.values()):
        assert label in values
        _check(tables["run b"], y)
        _check(tables["difference a - b (float32)"], x.detach() - y.detach())
        assert tables["comparison"]["status"] == "differs"
        dx, dy = x.detach().double(), y.detach().double()
        assert float(tables["comparison"]["rel. L2"]) == pytest.approx(float((dx - dy).norm() / dx.norm()), rel=1e-4)
    assert opened[0] == "linear_1_1" and opened[1]["run b"]["label"] == "linear_1_2"
    marked = {label: mark for label, (mark, _, _) in nodes.items() if mark is not None}
    assert marked == {"relu_1_2": "not saved", "mul_1_3": "only in a"}
    fills = {label: fill for label, (_, fill, _) in nodes.items()}
    assert len({fills["relu_1_2"], fills["mul_1_3"], fills["linear_2_4"], "#f2f2f2"}) == 4  # apart
    assert nodes["relu_1_2"][2] and nodes["mul_1_3"][2] and not nodes["linear_2_4"][2]  # dashed outline
    assert [(mark, text) for mark, text, _ in legend[0]] == [("not saved", "not saved"), ("only in a", "only in a")]
    assert [swatch for _, _, swatch in legend[0]] == [_rgb(fills["relu_1_2"]), _rgb(fills["mul_1_3"])]
    assert legend[1] == ["1 pass only in run b, not drawn: add_1_1"]
    assert all(mark is None and not dash for mark, _, dash in by_kind.values())  # marks belong to the scale
