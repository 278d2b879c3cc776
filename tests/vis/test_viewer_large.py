"""Large graphs in the viewer without freezing (headless Chromium): layout in a worker that can
be cancelled, no "draw anyway" where Graphviz would overflow, a long loop's passes a page at a time."""
from __future__ import annotations

import pytest
import torch

import torchlog
from tests.models import LongLoop
from tests.vis.browser import open_page, run_and_wait, start_browser, wait_for
from tests.vis.test_viewer_first_view import gpt2_history

pytestmark = pytest.mark.browser
# Whether the page answered a timer set just before a redraw while that redraw was laid out:
# the redraw count the timer saw (the count before the redraw: it ran meanwhile).
CLICK_WITH_TIMER = ("const before = document.body.dataset.renders; window.timerSaw = null;"
                    "setTimeout(() => { window.timerSaw = document.body.dataset.renders; }, 0);"
                    "document.getElementById('torchlog-expand-all').click(); return before;")


@pytest.fixture(scope="module")
def driver():
    browser = start_browser()
    yield browser
    browser.quit()


@pytest.mark.heavy
def test_expand_all_lays_out_in_a_worker_and_the_page_answers_meanwhile(driver, tmp_path):
    """The main thread is free while Graphviz lays out 576 nodes (the longest main-thread task,
    from the Long Tasks API, is a figure of bench/viewer_bench.py, not a timed test)."""
    history = gpt2_history(12)
    open_page(driver, history.to_html(tmp_path / "gpt2.html", depth=1))
    before = driver.execute_script(CLICK_WITH_TIMER)
    wait_for(driver, f"return Number(document.body.dataset.renders) > {before}")
    last = driver.execute_script("return window.torchlogViewer.timings.at(-1)")
    assert last["nodes"] > 500 and last["worker"] is True
    assert driver.execute_script("return window.timerSaw") == before  # it ran during the layout
    # A layout can be cancelled: the view and the controls stay as they were drawn.
    run_and_wait(driver, "await window.torchlogViewer.setDepth(1);")
    drawn = driver.execute_script("return document.querySelectorAll('#torchlog-graph g.node').length")
    run_and_wait(driver, "document.getElementById('torchlog-expand-all').click(); window.torchlogViewer.cancelLayout();")
    assert driver.execute_script("return window.torchlogViewer.timings.at(-1).reason").startswith("cancelled")
    assert driver.execute_script("return [window.torchlogViewer.state.depth, document.getElementById('torchlog-depth').value,"
                                 " document.querySelectorAll('#torchlog-graph g.node').length]") == [1, "1", drawn]
    assert "cancelled" in driver.find_element("id", "torchlog-status").text
    run_and_wait(driver, "document.getElementById('torchlog-expand-all').click();")  # a new worker
    assert driver.execute_script("return window.torchlogViewer.timings.at(-1).nodes") > 500


def test_a_loop_too_long_to_lay_out_is_not_offered_and_its_passes_come_a_page_at_a_time(driver, tmp_path):
    steps = 2100
    history = torchlog.log_forward_pass(LongLoop(steps), torch.randn(1, 4))
    open_page(driver, history.to_html(tmp_path / "loop.html", mode="unrolled", depth=2))
    message = driver.find_element("id", "torchlog-graph").text
    assert "not offered" in message and "Graphviz" in message
    assert driver.find_elements("id", "torchlog-draw-anyway") == []
    run_and_wait(driver, "await window.torchlogViewer.setMode('rolled');")
    driver.execute_async_script("const done = arguments[arguments.length - 1];"
                                "window.torchlogViewer.goTo('linear_1_1').then(done);")
    clipped = driver.execute_script(  # the value axis's labels, minus sign included, inside the chart
        "return [...document.querySelectorAll('#torchlog-panel svg.passes text')].filter(t => t.getBBox().x < 0)"
        ".map(t => t.textContent)")
    assert clipped == [] and history["linear_1_1:1"].tensor_contents.min() < 0
    assert driver.execute_script("return document.querySelector('#torchlog-panel svg.passes').textContent").count("-") >= 1
    pages = driver.execute_script(
        "return [document.querySelectorAll('#torchlog-panel details').length,"
        " document.querySelector('#torchlog-panel .pager').textContent]")
    assert pages[0] == 50 and f"passes 1-50 of {steps}" in pages[1]
    driver.find_element("css selector", "#torchlog-panel .pager button:last-of-type").click()
    last = driver.execute_script(
        "return [[...document.querySelectorAll('#torchlog-panel details summary')].map(s => s.textContent.split(':')[0]),"
        " document.querySelector('#torchlog-panel .pager').textContent]")
    assert last[0] == [f"pass {n}" for n in range(2051, steps + 1)] and f"passes 2051-{steps} of {steps}" in last[1]
    assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
