"""An additive attention mask (`torch.finfo(dtype).min`) on the page: counted apart, never in
a colour scale, a search's statistics or a heatmap's scale (headless Chromium)."""
from __future__ import annotations

import pytest
import torch

from tests.vis.browser import open_page, start_browser
from tests.vis.test_viewer_first_view import gpt2_history

pytestmark = [pytest.mark.browser, pytest.mark.heavy]


@pytest.fixture(scope="module")
def driver():
    browser = start_browser()
    yield browser
    browser.quit()


def _fills(value: torch.Tensor) -> int:
    info = torch.finfo(value.dtype)
    return int(((value == info.min) | (value == info.max)).sum())


def _kept(value: torch.Tensor) -> torch.Tensor:
    """The entries that are values: neither NaN, Inf nor a mask's fill."""
    if not value.is_floating_point():
        return value.double()
    info = torch.finfo(value.dtype)
    value = value.detach()
    return value[torch.isfinite(value) & (value != info.min) & (value != info.max)]


def test_mask_fills_stay_out_of_colours_searches_and_heatmaps(driver, tmp_path):
    history = gpt2_history(2)
    saved = [r for r in history if r.has_saved_tensor]
    masked = [r for r in saved if r.tensor_contents.is_floating_point() and _fills(r.tensor_contents)]
    assert masked  # the mask and the scores it was added to
    largest = max(float(_kept(r.tensor_contents).abs().max()) for r in saved if _kept(r.tensor_contents).numel())
    open_page(driver, history.to_html(tmp_path / "gpt2.html", depth=3))
    driver.execute_script("window.torchlogViewer.setColour('absmax')")
    legend_hi = driver.execute_script(
        "return Math.max(...[...document.querySelectorAll('#torchlog-graph [data-colour-value]')]"
        ".map(g => Math.abs(Number(g.dataset.colourValue))))")
    assert legend_hi == pytest.approx(largest, rel=1e-5) and legend_hi < 1e6
    found = driver.execute_script(
        "window.torchlogViewer.runSearch('absmax>1e30'); return document.getElementById('torchlog-status').textContent")
    assert "no" in found.lower()
    # The panel of a masked value gives the share apart and draws masked cells in their own colour.
    scores = max(masked, key=lambda r: r.tensor_contents.dim())
    driver.execute_async_script("const done = arguments[arguments.length - 1];"
                                f"window.torchlogViewer.goTo({scores.label!r}).then(done);")
    share = 100 * _fills(scores.tensor_contents) / scores.tensor_contents.numel()
    row = driver.execute_script(
        "const r = [...document.querySelectorAll('#torchlog-panel tr')].find(tr => tr.cells[0].textContent === 'masked');"
        "return r && r.cells[1].textContent")
    assert row is not None and row.startswith(f"{share:.1f} %")
    if scores.tensor_contents.dim() >= 2 and min(scores.tensor_contents.shape[-2:]) >= 8:
        assert driver.execute_script("return document.querySelector('#torchlog-panel .heat .holes') !== null")


def test_a_collapsed_block_takes_the_colour_of_its_output(driver, tmp_path):
    history = gpt2_history(2)
    open_page(driver, history.to_html(tmp_path / "blocks.html", depth=1))
    driver.execute_script("window.torchlogViewer.setColour('std')")
    for block in ("h.0", "h.1"):
        returned = [r for r in history if f"{block}:1" in r.output_of_modules]
        assert len(returned) == 1
        expected = float(returned[0].tensor_contents.detach().double().std(unbiased=False))
        inside = max(float(_kept(r.tensor_contents).std(unbiased=False)) for r in history
                     if f"{block}:1" in r.containing_modules and r.has_saved_tensor and _kept(r.tensor_contents).numel() > 1)
        assert inside > expected * 1.01  # the block's largest std is elsewhere inside it
        shown = driver.execute_script(
            f"return Number(document.querySelector('#torchlog-graph g.node[data-module=\"{block}\"]').dataset.colourValue)")
        assert shown == pytest.approx(expected, rel=1e-5)


def test_a_heatmap_picks_its_head_and_names_its_axes(driver, tmp_path):
    from selenium.webdriver.support.ui import Select

    history = gpt2_history(2)
    softmax = next(r for r in history if r.func_name == "softmax")
    value = softmax.tensor_contents.detach()
    assert value.dim() == 4 and value.shape[1] == 2
    open_page(driver, history.to_html(tmp_path / "heads.html", depth=1))
    driver.execute_async_script("const done = arguments[arguments.length - 1];"
                                f"window.torchlogViewer.goTo({softmax.label!r}).then(done);")
    rows, cols = value.shape[-2:]
    assert driver.find_element("css selector", "#torchlog-panel .heat .axes").text == \
        f"rows: dim 2 ({rows}), columns: dim 3 ({cols})"
    Select(driver.find_element("css selector", "#torchlog-panel .heat select")).select_by_value("1")
    shown = driver.execute_script(
        "const img = document.querySelector('#torchlog-panel .heat img');"
        "return [img.dataset.slice, document.querySelector('#torchlog-panel .heat .heat-body .legend').textContent]")
    assert shown == ["1", f"slice [0, 1, :, :] of (1, 2, {rows}, {cols})"]
    cells = driver.execute_script(
        f"const p = window.torchlogViewer.data.passes.find(p => p.label === {softmax.label!r});"
        "return [...atob(p.stats.heat.more[0].cells)].map(c => c.charCodeAt(0));")
    plane = value[0, 1].double()
    expected = ((plane - plane.min()) / (plane.max() - plane.min()) * 255).round().reshape(-1).tolist()
    assert max(abs(a - b) for a, b in zip(cells, expected)) <= 1
