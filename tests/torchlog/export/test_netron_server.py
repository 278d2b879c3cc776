"""Netron opens what to_onnx writes (torchlog/export/netron_server.py): the netron package's
server on 127.0.0.1 and headless Chromium, counting the nodes Netron draws."""
from __future__ import annotations

import time

import pytest

from tests.torchlog.export.histories import gpt2, nested, partial, recurrent
from tests.vis.browser import start_browser, wait_for
from torchlog.export import serve_netron
from torchlog.export.onnx_functions import call_tree

pytestmark = pytest.mark.browser

# Drawn op and module-call nodes (Netron draws graph inputs and outputs with other classes).
NODES = "return document.querySelectorAll('#canvas g.node.graph-node').length"
IDS = "return Array.from(document.querySelectorAll('#canvas g.node.graph-node')).map(g => g.id)"
INPUTS = "return document.querySelectorAll('#canvas g.node.graph-input').length"
# (name, value) of each row of the sidebar's Metrics section; null until it is shown.
SIDEBAR_METRICS = """
const sidebar = document.getElementById('sidebar-content');
const section = sidebar && Array.from(sidebar.querySelectorAll('.sidebar-section'))
    .find(s => s.textContent === 'Metrics');
if (!section) return null;
const rows = [];
for (let item = section.nextElementSibling; item && item.classList.contains('sidebar-item');
     item = item.nextElementSibling) {
  rows.push([item.querySelector('.sidebar-item-name input').value,
             item.querySelector('.sidebar-item-value-line').textContent]);
}
return rows;
"""


@pytest.fixture(scope="module")
def browser():
    driver = start_browser()
    yield driver
    driver.quit()


def _open(driver, server) -> int:
    """Load Netron's page with its consent question answered (the network is closed, so Netron
    asks on every start) and wait until the graph is drawn; returns the node count."""
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setCookie", {"name": "consent", "value": "1", "url": server.url})
    driver.get(server.url)
    return wait_for(driver, NODES, 120)


def _item_text(driver, node_id: str, last: bool) -> object:
    """The text of a node's first or last header item: what a click lands on (the box around
    it lies under the text)."""
    return driver.execute_script(
        f"const items = document.getElementById({node_id!r}).querySelectorAll('.node-item-type');"
        f"return items[{'items.length - 1' if last else 0}].querySelector('text')")


def _click(driver, element) -> None:
    """A real click on `element`, waiting while something else is drawn over it: Netron's
    graph can still be moving, or covered by a toast, for a moment after it draws (a
    WebDriver click lands on whatever is on top: 'element click intercepted')."""
    from selenium.common.exceptions import ElementClickInterceptedException

    deadline = time.monotonic() + 30
    while True:
        try:
            element.click()
            return
        except ElementClickInterceptedException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _open_function(driver, node_id: str) -> None:
    """Click the `ƒ` of a module-call node, as a person opens the module's subgraph."""
    opener = _item_text(driver, node_id, last=True)
    assert opener.get_attribute("textContent") == "ƒ"
    _click(driver, opener)


def _served(history, tmp_path, name="run.onnx"):
    return serve_netron(history.to_onnx(str(tmp_path / name)))


def test_netron_draws_the_top_level_of_the_graph(browser, tmp_path):
    history = nested()
    server = _served(history, tmp_path)
    try:
        count = _open(browser, server)
        assert count == len(call_tree(history).items) == 4
        assert browser.execute_script(IDS) == [
            "node-name-block1:1", "node-name-block2:1", "node-name-head:1", "node-name-output_1_10"]
        assert browser.execute_script(INPUTS) == 1
    finally:
        server.stop()


def test_a_module_call_opens_like_a_subgraph(browser, tmp_path):
    server = _served(nested(), tmp_path)
    try:
        _open(browser, server)
        _open_function(browser, "node-name-block1:1")
        wait_for(browser, "return document.getElementById('node-name-add_1_3') !== null", 60)
        assert browser.execute_script(IDS) == [
            "node-name-block1.inner:1", "node-name-add_1_3", "node-name-block1.norm:1"]
    finally:
        server.stop()


def test_the_metrics_attachment_shows_in_the_sidebar(browser, tmp_path):
    history = nested()
    server = _served(history, tmp_path)
    try:
        _open(browser, server)
        # What File > Open of run.metrics.json does, without the native file dialog.
        status = browser.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch('/data/run.metrics.json').then(r => r.blob()).then(b => {"
            "  const file = new File([b], 'run.metrics.json');"
            "  return window.__view__._host._open(file, [file]); })"
            ".then(() => done('ok'), e => done('error: ' + e));")
        assert status == "ok"
        _click(browser, _item_text(browser, "node-name-head:1", last=False))
        rows = wait_for(browser, SIDEBAR_METRICS, 60)
        time_us = sum(p.elapsed_s for p in history if "head:1" in p.containing_modules) * 1e6
        assert [name for name, _ in rows] == ["time (µs)", "ops"]
        assert float(rows[0][1]) == pytest.approx(time_us, abs=1e-2) and rows[1][1] == "1"
    finally:
        server.stop()


@pytest.mark.parametrize("make, expected", [(recurrent, 13), (partial, 3)],
                         ids=["recurrent", "partial"])
def test_recurrent_and_partial_histories_draw(browser, tmp_path, make, expected):
    history = make()
    server = _served(history, tmp_path)
    try:
        assert _open(browser, server) == len(call_tree(history).items) + history.is_partial \
            == expected
    finally:
        server.stop()


@pytest.mark.heavy
def test_gpt2_draws_and_its_blocks_open(browser, tmp_path):
    history, _, _ = gpt2()
    server = _served(history, tmp_path)
    try:
        assert _open(browser, server) == len(call_tree(history).items) == 4
        _open_function(browser, "node-name-transformer:1")
        inside = wait_for(browser, "const ids = Array.from(document.querySelectorAll("
                          "'#canvas g.node.graph-node')).map(g => g.id);"
                          "return ids.includes('node-name-transformer.h.1:1') && ids", 60)
        assert "node-name-transformer.ln_f:1" in inside
    finally:
        server.stop()
