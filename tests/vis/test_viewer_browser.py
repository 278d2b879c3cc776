"""The interactive viewer in a real browser (headless Chromium driven by selenium).

Node counts are checked against the graphviz view's placement (`count_nodes`), which is
Python code independent of the page's JavaScript; expanded states against a direct
reading of the history's module chains.
"""
from __future__ import annotations

import base64
import inspect
import json
import os
from pathlib import Path

import pytest
import torch
from torch import nn

import torchlog
from tests.models import LongLoop, Nested, SimpleRecurrent
from tests.vis.browser import open_page, run_and_wait, start_browser, wait_for
from torchlog.vis.viewer.page import count_nodes, page_node_count, show

pytestmark = pytest.mark.browser
SCREENSHOTS = Path(__file__).resolve().parents[2] / "build" / "viewer-screenshots"


@pytest.fixture(scope="module")
def driver():
    browser = start_browser()
    yield browser
    browser.quit()


def _open(driver, history, tmp_path: Path, name: str = "page", **view) -> None:
    open_page(driver, history.to_html(tmp_path / f"{name}.html", **view))


def _labels(driver) -> list[str]:
    return driver.execute_script(
        "return [...document.querySelectorAll('#torchlog-graph [data-label]')].map(g => g.dataset.label)")


def _modules(driver) -> dict[str, str]:
    """Drawn modules by call ('block1:1', from data-module and data-call): expanded or not."""
    return driver.execute_script(
        "const out = {}; document.querySelectorAll('#torchlog-graph [data-module]').forEach(g => {"
        "  const key = g.dataset.call ? `${g.dataset.module}:${g.dataset.call}` : g.dataset.module;"
        "  out[key] = g.dataset.expanded; }); return out;")


def _num_nodes(driver) -> int:
    return driver.execute_script("return document.querySelectorAll('#torchlog-graph g.node').length")


def _panel_rows(driver) -> dict[str, str]:
    return driver.execute_script(
        "const out = {}; document.querySelectorAll('#torchlog-panel tr').forEach(tr => {"
        "  const [k, v] = tr.querySelectorAll('td'); if (!(k.textContent in out)) out[k.textContent] = v.textContent; });"
        "return out;")


def _panel_title(driver) -> str:
    return driver.execute_script("return document.querySelector('#torchlog-panel h2')?.textContent")


def _screenshot(driver, name: str) -> Path:
    """Keep a picture a person can look at (build/viewer-screenshots/) and check it is one."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    driver.save_screenshot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    return path


def _click(driver, css: str) -> None:
    """A real mouse click on the first displayed element matching `css` (selenium; zoomed out,
    a box shows its short title in place of its full one), then wait for the redraw it causes."""
    before = int(driver.execute_script("return document.body.dataset.renders"))
    shown = [e for e in driver.find_elements("css selector", css) if e.is_displayed()]
    assert shown, f"nothing displayed matches {css!r}"
    shown[0].click()
    wait_for(driver, f"return Number(document.body.dataset.renders) > {before}")


def _nested_history() -> torchlog.ModelHistory:
    torch.manual_seed(0)
    return torchlog.log_forward_pass(Nested(), torch.randn(2, 4), random_seed=0)


def test_drawn_nodes_match_the_history_at_every_depth(driver, tmp_path):
    history = _nested_history()
    _open(driver, history, tmp_path, depth=1)
    for depth in (1, 2, 3, 4):
        if depth > 1:
            run_and_wait(driver, f"await window.torchlogViewer.setDepth({depth});")
        assert _num_nodes(driver) == count_nodes(history, "unrolled", depth), f"depth {depth}"
    every = {r.label for r in history if not r.is_buffer}
    assert set(_labels(driver)) == every  # depth 4 is below the deepest module
    assert set(_modules(driver).values()) == {"true"}
    assert len(_modules(driver)) == len({c for r in history for c in r.containing_modules})


def test_click_expands_one_module_and_its_title_collapses_it(driver, tmp_path):
    history = _nested_history()
    _open(driver, history, tmp_path, depth=1)
    assert _modules(driver) == {"block1:1": "false", "block2:1": "false", "head:1": "false"}
    _click(driver, '#torchlog-graph g.node[data-module="block1"][data-call="1"]')
    assert _modules(driver) == {"block1:1": "true", "block1.inner:1": "false", "block1.norm:1": "false",
                                "block2:1": "false", "head:1": "false"}
    # The add between inner and norm runs in block1 itself, so it is now an op node there.
    inside_block1 = [r.label for r in history if r.containing_modules == ("block1:1",)]
    assert inside_block1 and set(inside_block1) <= set(_labels(driver))
    assert "block1:1" in _panel_title(driver)
    _click(driver, '#torchlog-graph g.cluster[data-module="block1"] > text')
    assert _modules(driver) == {"block1:1": "false", "block2:1": "false", "head:1": "false"}
    assert _num_nodes(driver) == count_nodes(history, "unrolled", 1)


def test_clicking_a_node_shows_what_was_recorded_and_its_links_move_the_view(driver, tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    history = torchlog.log_forward_pass(model, torch.randn(3, 4), random_seed=0)
    _open(driver, history, tmp_path)
    driver.find_element("css selector", '#torchlog-graph [data-label="linear_1_1"]').click()
    assert _panel_title(driver) == "linear_1_1"
    rows = _panel_rows(driver)
    record = history["linear_1_1"]
    saved = record.tensor_contents
    assert rows["function"] == "linear" and rows["shape"] == "(3, 8)" and rows["dtype"] == "float32"
    assert rows["in modules"] == "0:1" and "0.weight (8, 4), 32" in rows["params"]
    # nn.Sequential runs in torch, so the call site is the user's line that called the model,
    # with its source text.
    assert "test_viewer_browser.py:" in rows["call site"]
    assert "history = torchlog.log_forward_pass(model, torch.randn(3, 4), random_seed=0)" in rows["call site"]
    assert rows["parents"].startswith("input_1_0") and rows["children"] == "relu_1_2"
    assert float(rows["max"]) == pytest.approx(saved.max().item(), rel=1e-4)
    assert float(rows["min"]) == pytest.approx(saved.min().item(), rel=1e-4)
    assert float(rows["mean"]) == pytest.approx(saved.mean().item(), rel=1e-3, abs=1e-6)
    assert rows["NaN"] == "0" and rows["Inf"] == "0" and rows["elements"] == "24"
    assert driver.execute_script("return document.querySelectorAll('#torchlog-panel svg.hist rect').length") == 24
    driver.find_element("css selector", '#torchlog-panel a[data-goto="relu_1_2"]').click()
    wait_for(driver, "return document.querySelector('#torchlog-panel h2').textContent === 'relu_1_2'")
    selected = driver.execute_script(
        "return document.querySelector('#torchlog-graph g.torchlog-selected').dataset.label")
    assert selected == "relu_1_2"


def test_search_expands_the_modules_around_a_label_and_centres_it(driver, tmp_path):
    history = _nested_history()
    _open(driver, history, tmp_path, depth=1)
    target = next(r.label for r in history if r.containing_modules[:1] == ("block2.inner:1",)
                  and r.layer_type == "relu")
    box = driver.find_element("css selector", "#torchlog-search")
    box.send_keys(target + "\n")
    wait_for(driver, f"return document.querySelector('#torchlog-panel h2')?.textContent === {target!r}")
    assert _modules(driver)["block2.inner:1"] == "true" and _modules(driver)["block1:1"] == "false"
    hit = driver.execute_script(f"return document.querySelector('[data-label=\"{target}\"]').classList.contains('torchlog-hit')")
    assert hit
    # Centred: the node's centre is near the middle of the graph area.
    offset = driver.execute_script(
        f"const r = document.querySelector('[data-label=\"{target}\"]').getBoundingClientRect();"
        "const g = document.getElementById('torchlog-graph').getBoundingClientRect();"
        "return [Math.abs(r.x + r.width / 2 - g.x - g.width / 2), Math.abs(r.y + r.height / 2 - g.y - g.height / 2)];")
    assert offset[0] < 20 and offset[1] < 20
    box.clear()
    box.send_keys("block1.norm\n")
    wait_for(driver, "return document.querySelector('#torchlog-panel h2')?.textContent === 'block1.norm:1'")
    assert "block1.norm:1" in _modules(driver)


def test_recurrent_model_rolled_and_unrolled(driver, tmp_path):
    history = torchlog.log_forward_pass(SimpleRecurrent(), torch.randn(1, 5), random_seed=0)
    _open(driver, history, tmp_path, mode="rolled", depth=None)
    assert sorted(_labels(driver)) == sorted(l.label for l in history.layers)
    text = driver.execute_script("return document.querySelector('#torchlog-graph svg').textContent")
    for expected in ("linear_1_1 (x4)", "mul_1_3 (x4)", "Out 1-3", "In 2-4", "fc (Linear) x4"):
        assert expected in text
    driver.find_element("css selector", '[data-label="add_1_2"]').click()
    passes = driver.execute_script("return document.querySelectorAll('#torchlog-panel details').length")
    assert _panel_title(driver) == "add_1_2 (x4)" and passes == 4
    run_and_wait(driver, "await window.torchlogViewer.setMode('unrolled');")
    assert sorted(_labels(driver)) == sorted(history.layer_labels)
    assert _num_nodes(driver) == count_nodes(history, "unrolled", None)
    _screenshot(driver, "simple_recurrent_unrolled")


class _Broken(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(3, 3)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_partial_history_opens_with_the_failing_op_in_red(driver, tmp_path):
    with pytest.raises(RuntimeError) as caught:
        torchlog.log_forward_pass(_Broken(), torch.randn(2, 4))
    history = caught.value.torchlog_history
    _open(driver, history, tmp_path)
    assert _num_nodes(driver) == count_nodes(history, "unrolled", None) + 1
    fill = driver.execute_script(
        "return document.querySelector('g.node[data-failed] polygon').getAttribute('fill')")
    assert fill.lower() == "#e03030"
    panel = driver.find_element("id", "torchlog-panel").text
    assert "forward pass failed" in panel and history.info.failure in panel
    assert "RuntimeError: mat1 and mat2 shapes cannot be multiplied" in panel
    assert "relu_1_2" in panel  # the input of the op that raised, as a link
    _screenshot(driver, "partial_history")


def test_nan_and_inf_values_render_with_their_counts(driver, tmp_path):
    class Bad(nn.Module):
        def forward(self, x):
            return torch.log(x) * 2

    history = torchlog.log_forward_pass(Bad(), torch.tensor([[-1.0, 0.0, 1.0, 2.0]]))
    _open(driver, history, tmp_path)
    driver.find_element("css selector", '[data-label="log_1_1"]').click()
    rows = _panel_rows(driver)
    assert rows["NaN"] == "1" and rows["Inf"] == "1" and float(rows["max"]) == pytest.approx(0.693147, rel=1e-5)


def test_export_gives_the_drawn_graph_as_svg_and_png(driver, tmp_path):
    history = _nested_history()
    _open(driver, history, tmp_path, depth=2)
    svg = driver.execute_script("return window.torchlogViewer.svgText()")
    assert svg.startswith("<svg") and svg.count('class="node"') == count_nodes(history, "unrolled", 2)
    url = driver.execute_async_script(
        "const done = arguments[0]; window.torchlogViewer.pngDataUrl().then(done, e => done(String(e)));")
    png = base64.b64decode(url.split(",", 1)[1])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5_000


class _Modèle(nn.Module):  # a name beyond ASCII
    def __init__(self) -> None:
        super().__init__()
        self.couche_é = nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.couche_é(x))


def test_notebook_frame_survives_a_host_page_in_another_encoding(driver, tmp_path):
    history = torchlog.log_forward_pass(_Modèle(), torch.randn(2, 4), random_seed=0)
    host = tmp_path / "notebook.html"
    frame = show(history, depth=2, height=700)._repr_html_()
    host.write_bytes(b'<html><head><meta charset="windows-1252"></head><body>'
                     + frame.encode("ascii") + b"</body></html>")
    driver.get(host.as_uri())
    assert driver.execute_script("return document.querySelector('.torchlog-frame').offsetHeight") == 700
    driver.switch_to.frame(driver.find_element("tag name", "iframe"))
    try:
        wait_for(driver, "return document.body && document.body.dataset.ready")
        assert _num_nodes(driver) == count_nodes(history, "unrolled", 2)
        assert driver.find_element("id", "torchlog-title").text == "_Modèle"
        driver.find_element("css selector", '[data-label="linear_1_1"]').click()
        assert _panel_rows(driver)["in modules"] == "couche_é:1"
        assert _panel_rows(driver)["time"].endswith(" \u00b5s")
        assert driver.find_element("id", "torchlog-breadcrumb").text == "_Modèle \u203a couche_é \u203a linear_1_1"
    finally:
        driver.switch_to.default_content()


class _AModelWhoseClassNameIsLongerThanAnyToolbarWouldWishItToBeEvenOnAWideScreen(nn.Module):
    def forward(self, x):
        return x * 2


def test_the_toolbar_stays_put_and_shows_the_search_hint_whole(driver, tmp_path):
    history = torchlog.log_forward_pass(
        _AModelWhoseClassNameIsLongerThanAnyToolbarWouldWishItToBeEvenOnAWideScreen(), torch.ones(2))
    _open(driver, history, tmp_path)
    fits = driver.execute_script(
        "const box = document.getElementById('torchlog-search'); const style = getComputedStyle(box);"
        "const ctx = document.createElement('canvas').getContext('2d'); ctx.font = style.font;"
        "const room = box.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);"
        "return [ctx.measureText(box.placeholder).width, room];")
    assert fits[0] <= fits[1]
    where = ("const r = document.getElementById('torchlog-search').getBoundingClientRect();"
             "return [r.left, r.top, r.width, document.getElementById('torchlog-toolbar').offsetHeight];")
    before = driver.execute_script(where)
    driver.find_element("css selector", "#torchlog-search").send_keys("no such label anywhere in this model at all\n")
    wait_for(driver, "return document.getElementById('torchlog-status').textContent.startsWith('nothing matches')")
    assert driver.execute_script(where) == before


@pytest.fixture(scope="module")
def gpt2_history() -> torchlog.ModelHistory:
    """A tiny GPT-2 (transformers' own code, a config built here, nothing downloaded)."""
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
                        bos_token_id=99, eos_token_id=99, attn_implementation="eager")
    model = GPT2Model(config).eval()
    return torchlog.log_forward_pass(model, torch.randint(0, 100, (1, 12)), random_seed=0)


def _inside(driver, inner_css: str, outer_css: str) -> bool:
    """Whether the drawn box of `inner_css` lies within that of `outer_css` (1 px slack)."""
    return driver.execute_script(
        "const a = document.querySelector(arguments[0]).getBoundingClientRect();"
        "const b = document.querySelector(arguments[1]).getBoundingClientRect();"
        "return a.left >= b.left - 1 && a.right <= b.right + 1 && a.top >= b.top - 1 && a.bottom <= b.bottom + 1;",
        inner_css, outer_css)


@pytest.mark.heavy
def test_a_gpt2_block_is_found_by_its_address_and_expands_to_its_ops(driver, gpt2_history, tmp_path):
    history = gpt2_history
    _open(driver, history, tmp_path, depth=1)
    # The page's contract: data-module is the module address, the call apart.
    block = driver.execute_script(
        "const g = document.querySelector('#torchlog-graph [data-module=\"h.0\"]');"
        "return g && [g.dataset.call, g.dataset.expanded];")
    assert block == ["1", "false"]
    _click(driver, '#torchlog-graph g.node[data-module="h.0"]')
    assert _modules(driver)["h.0:1"] == "true"
    own_ops = [r.label for r in history if r.containing_modules[:1] == ("h.0:1",)]
    assert own_ops  # the residual adds run in the block itself
    for label in own_ops:
        assert _inside(driver, f'[data-label="{label}"]', '#torchlog-graph g.cluster[data-module="h.0"]')
    inner = {r.containing_modules[-2].split(":")[0] for r in history
             if len(r.containing_modules) >= 2 and r.containing_modules[-1] == "h.0:1"}
    assert {"h.0.attn", "h.0.mlp", "h.0.ln_1"} <= inner
    assert inner <= set(driver.execute_script(
        "return [...document.querySelectorAll('#torchlog-graph [data-module]')].map(g => g.dataset.module)"))


@pytest.mark.heavy
def test_transformers_gpt2_from_blocks_down_to_attention(driver, gpt2_history, tmp_path):
    history = gpt2_history
    _open(driver, history, tmp_path)
    state = driver.execute_script("return [window.torchlogViewer.state.mode, window.torchlogViewer.state.depth]")
    assert state[0] == "unrolled"
    assert _num_nodes(driver) == page_node_count(history, "unrolled", state[1])
    assert any(m.startswith("h.0") for m in _modules(driver))
    _screenshot(driver, "gpt2_default_depth")
    softmax = next(r.label for r in history if r.func_name == "softmax")
    driver.find_element("css selector", "#torchlog-search").send_keys("softmax\n")
    wait_for(driver, f"return document.querySelector('#torchlog-panel h2')?.textContent === {softmax!r}")
    assert _modules(driver)["h.0.attn:1"] == "true"
    _screenshot(driver, "gpt2_attention_softmax")
    run_and_wait(driver, "await window.torchlogViewer.setDepth(100);")
    assert _num_nodes(driver) == page_node_count(history, "unrolled", None)


def test_a_graph_too_large_to_lay_out_asks_first_and_the_rolled_view_draws_it(driver, tmp_path):
    history = torchlog.log_forward_pass(LongLoop(900), torch.randn(1, 4))
    _open(driver, history, tmp_path, mode="unrolled", depth=2)  # depth 2: every module open
    message = driver.find_element("id", "torchlog-graph").text
    assert f"{count_nodes(history, 'unrolled', 2)} nodes" in message and "draw anyway" in message
    assert _num_nodes(driver) == 0
    run_and_wait(driver, "await window.torchlogViewer.setMode('rolled');")
    assert sorted(_labels(driver)) == sorted(l.label for l in history.layers)
    assert "linear_1_1 (x900)" in driver.execute_script(
        "return document.querySelector('#torchlog-graph svg').textContent")


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4)
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return self.fc(self.attn(x, x, x)[0])


def test_a_python_functional_is_a_box_like_a_module_call(driver, tmp_path):
    torch.manual_seed(0)
    history = torchlog.log_forward_pass(_Attention(), torch.randn(3, 2, 16), random_seed=0)
    scope = "attn.multi_head_attention_forward:1"
    inside = [r.label for r in history if scope in r.extra.get("functionals", ())]
    softmax = next(r for r in history if r.func_name == "softmax")
    assert softmax.label in inside
    _open(driver, history, tmp_path, depth=2)  # attn:1 open, the functional inside it collapsed
    assert _modules(driver) == {"attn:1": "true", scope: "false", "fc:1": "true"}
    address = scope.removesuffix(":1")
    text = driver.execute_script(f"return document.querySelector('[data-module=\"{address}\"]').textContent")
    assert f"{scope.removeprefix('attn.')} (functional)" in text and "in: (3, 2, 16)" in text  # the box shows attn
    _click(driver, f'#torchlog-graph g.node[data-module="{address}"][data-call="1"]')
    assert set(inside) <= set(_labels(driver))
    driver.execute_script(f"return window.torchlogViewer.goTo({softmax.label!r})")  # on screen
    driver.find_element("css selector", f'[data-label="{softmax.label}"]').click()
    rows = _panel_rows(driver)
    assert rows["in modules"] == f"{scope} ‹ attn:1"
    assert float(rows["max"]) == pytest.approx(softmax.tensor_contents.max().item(), rel=1e-4)


def test_leaving_the_search_box_keeps_the_match_enter_found(driver, tmp_path):
    history = _nested_history()
    _open(driver, history, tmp_path, depth=1)
    relus = [r.label for r in history if r.func_name == "relu"]
    assert len(relus) == 2
    driver.find_element("css selector", "#torchlog-search").send_keys("relu\n")
    wait_for(driver, f"return document.querySelector('#torchlog-panel h2')?.textContent === {relus[0]!r}")
    status = driver.find_element("id", "torchlog-status").text
    assert "match 1 of 2" in status
    driver.find_element("id", "torchlog-fit").click()  # the search box loses focus
    driver.execute_script("return new Promise(r => setTimeout(r, 200))")
    assert driver.find_element("id", "torchlog-status").text == status
    assert _panel_title(driver) == relus[0]


def _drawn_outside(driver) -> list[str]:
    """Keys of drawn nodes not wholly inside the graph area."""
    return driver.execute_script(
        "const g = document.getElementById('torchlog-graph').getBoundingClientRect();"
        "return [...document.querySelectorAll('#torchlog-graph g.node')].filter(n => {"
        "  const r = n.getBoundingClientRect();"
        "  return r.left < g.left - 1 || r.right > g.right + 1 || r.top < g.top - 1 || r.bottom > g.bottom + 1;"
        "}).map(n => n.dataset.key);")


def _smallest_visible_text_px(driver) -> float:
    """The height on screen of the smallest text of the graph that is displayed."""
    return driver.execute_script(
        "const sizes = [...document.querySelectorAll('#torchlog-graph svg text')]"
        "  .filter(t => getComputedStyle(t).display !== 'none')"
        "  .map(t => t.getBoundingClientRect().height).filter(h => h > 0);"
        "return sizes.length ? Math.min(...sizes) : 1000;")


@pytest.mark.heavy
def test_a_transformer_opens_whole_and_readable_with_an_overview(driver, gpt2_history, tmp_path):
    history = gpt2_history
    _open(driver, history, tmp_path)  # the default: the deepest view that fits readably
    assert _drawn_outside(driver) == []  # the whole model on screen
    assert {"h.0:1", "h.1:1"} <= set(_modules(driver))
    untitled = driver.execute_script(  # every node shows a title: its first line, or zoomed out its short one
        "return [...document.querySelectorAll('#torchlog-graph g.node')].filter(g => ![...g.querySelectorAll('text')]"
        ".some(t => getComputedStyle(t).display !== 'none' && t.textContent.trim())).length")
    assert untitled == 0 and _smallest_visible_text_px(driver) >= 6
    _screenshot(driver, "gpt2_first_view")
    _open(driver, history, tmp_path, name="deeper", depth=2)  # more than fits readably
    assert _num_nodes(driver) > 20 and _drawn_outside(driver) != []  # readable, so scrolled
    assert _smallest_visible_text_px(driver) >= 6  # what would be smaller is hidden
    top = driver.execute_script(  # the view starts at the top of the graph
        "const g = document.getElementById('torchlog-graph').getBoundingClientRect();"
        "return Math.min(...[...document.querySelectorAll('#torchlog-graph g.node')]"
        ".map(n => n.getBoundingClientRect().top)) - g.top;")
    assert 20 <= top <= 40
    driver.execute_script("window.torchlogViewer.fit()")  # the Fit button shows it all
    assert _drawn_outside(driver) == [] and _smallest_visible_text_px(driver) >= 6
    # The inset map shows the whole graph, and its "you are here" box covers all of it.
    inset = driver.execute_script(
        "const c = document.querySelector('#torchlog-overview canvas').getBoundingClientRect();"
        "const v = document.getElementById('torchlog-overview-view').getBoundingClientRect();"
        "return [document.getElementById('torchlog-overview').hidden, c.width, c.height, v.width, v.height];")
    assert inset[0] is False and max(inset[1:3]) == pytest.approx(180, abs=1)
    assert inset[3] == pytest.approx(inset[1], abs=3) and inset[4] == pytest.approx(inset[2], abs=3)
    # Zoomed in, the box shrinks; text grows back; clicking the inset moves the view.
    driver.execute_script("window.torchlogViewer.zoomBy(6)")
    small = driver.execute_script(  # the graph is tall: its height shows a 6x zoom
        "const v = document.getElementById('torchlog-overview-view').getBoundingClientRect(); return v.height")
    assert small == pytest.approx(inset[4] / 6, rel=0.1) and _smallest_visible_text_px(driver) >= 6
    before = driver.execute_script("return window.torchlogViewer.state.view.slice()")
    canvas = driver.find_element("css selector", "#torchlog-overview canvas")
    from selenium.webdriver import ActionChains
    ActionChains(driver).move_to_element_with_offset(canvas, 0, canvas.size["height"] // 2 - 5).click().perform()
    after = driver.execute_script("return window.torchlogViewer.state.view")
    assert after[1] > before[1] and after[2] == pytest.approx(before[2])
    # The breadcrumb names the modules around what is hovered or selected.
    softmax = next(r for r in history if r.func_name == "softmax")
    run_and_wait(driver, f"await window.torchlogViewer.goTo({softmax.label!r});")
    crumb = driver.find_element("id", "torchlog-breadcrumb").text
    assert crumb.endswith("h.0 \u203a h.0.attn \u203a " + softmax.label)
    _screenshot(driver, "gpt2_first_view_zoomed")


@pytest.mark.heavy
def test_mask_and_position_plumbing_folds_until_asked(driver, gpt2_history, tmp_path):
    history = gpt2_history
    loose = [r for r in history if not r.containing_modules and r.kind not in ("input", "output")]
    mask_ops = [r.label for r in loose if "masking_utils" in (r.call_site or "")]
    position_ops = [r.label for r in loose if r.func_name in ("arange", "unsqueeze") and r not in mask_ops]
    assert len(mask_ops) >= 10 and position_ops
    _open(driver, history, tmp_path, depth=1)
    drawn = set(_labels(driver))
    assert not drawn & set(mask_ops) and not drawn & set(position_ops)
    folds = driver.execute_script(
        "return [...document.querySelectorAll('#torchlog-graph g.node[data-plumbing]')]"
        ".map(g => [g.dataset.plumbing, g.dataset.module, g.querySelector('text').textContent])")
    kinds = {kind: (module, title) for kind, module, title in folds}
    assert kinds["helper"][0] == "masking_utils" and "sdpa_mask" in kinds["helper"][1]
    assert kinds["fold"][1].endswith("3 index ops (arange, add, unsqueeze)")
    blocks = [m for m in _modules(driver) if m.startswith("h.")]
    assert _num_nodes(driver) <= len(blocks) + 12  # the blocks, not the plumbing, fill the view
    folded = sum(len(m) - 1 for m in (mask_ops, position_ops[:1] * 3))
    assert _num_nodes(driver) == count_nodes(history, "unrolled", 1) - folded
    _screenshot(driver, "gpt2_plumbing_folded")
    _click(driver, "#torchlog-plumbing")
    assert set(mask_ops) | set(position_ops) <= set(_labels(driver))
    assert _num_nodes(driver) == count_nodes(history, "unrolled", 1)
    _click(driver, '#torchlog-graph g.cluster[data-plumbing="helper"] > text')  # fold one again
    assert not set(mask_ops) & set(_labels(driver))


def _rect(driver, css: str) -> dict:
    return driver.execute_script(
        "const r = document.querySelector(arguments[0]).getBoundingClientRect();"
        "return {left: r.left, top: r.top, width: r.width, height: r.height};", css)


def _scale(driver) -> float:
    """Screen pixels per unit of the drawing."""
    return driver.execute_script(
        "return document.getElementById('torchlog-graph').getBoundingClientRect().width"
        " / window.torchlogViewer.state.view[2]")


def _settled(driver) -> None:
    """Wait until the page's transitions are over."""
    driver.execute_script("return Promise.all(document.getAnimations().map(a => a.finished))")


@pytest.mark.heavy
def test_expanding_keeps_the_zoom_and_the_module_in_place(driver, gpt2_history, tmp_path):
    _open(driver, gpt2_history, tmp_path, depth=1)
    scale = _scale(driver)
    node = _rect(driver, '#torchlog-graph g.node[data-module="h.1"]')
    _click(driver, '#torchlog-graph g.node[data-module="h.1"]')
    glides = driver.execute_script("return window.torchlogViewer.timings.at(-1).glides")
    _settled(driver)
    assert _scale(driver) == pytest.approx(scale, rel=1e-3)
    box = _rect(driver, '#torchlog-graph g.cluster[data-module="h.1"]')
    graph = _rect(driver, "#torchlog-graph")
    crumb = _rect(driver, "#torchlog-breadcrumb")
    # The box starts where the node was, or as close as keeps its title on screen.
    assert box["left"] == pytest.approx(node["left"], abs=3) or box["left"] >= graph["left"]
    assert crumb["top"] + crumb["height"] <= box["top"] <= max(node["top"] + 3, graph["top"] + 30)
    assert box["top"] < graph["top"] + graph["height"] - 20
    assert glides > 0  # the nodes after h.1 moved down, gliding
    assert "\u203a h.1" in driver.find_element("id", "torchlog-breadcrumb").text  # the pointer is in it
    _click(driver, '#torchlog-graph g.cluster[data-module="h.1"] > text')
    _settled(driver)
    again = _rect(driver, '#torchlog-graph g.node[data-module="h.1"]')
    assert again["left"] == pytest.approx(box["left"], abs=3) and again["top"] == pytest.approx(box["top"], abs=3)
    assert _scale(driver) == pytest.approx(scale, rel=1e-3)


class _SteppedLSTM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(4, 8)

    def forward(self, x):
        h = c = torch.zeros(1, 8)
        for _ in range(3):
            h, c = self.cell(x, (h, c))
        return h


def test_a_call_returning_a_tuple_is_one_node(driver, tmp_path):
    history = torchlog.log_forward_pass(_SteppedLSTM(), torch.randn(1, 4), random_seed=0)
    firsts = [r.label for r in history if r.func_name == "lstm_cell" and r.output_index == 0]
    seconds = [r.label for r in history if r.func_name == "lstm_cell" and r.output_index == 1]
    assert len(firsts) == len(seconds) == 3
    _open(driver, history, tmp_path, depth=None)
    labels = _labels(driver)
    assert set(firsts) <= set(labels) and not set(seconds) & set(labels)
    assert _num_nodes(driver) == count_nodes(history, "unrolled", None) - 3
    text = driver.execute_script(f"return document.querySelector('[data-label=\"{firsts[0]}\"]').textContent")
    assert "2 outputs: (1, 8), (1, 8)" in text and text.count("params:") == 1
    # Searching the second output goes to the call's node and shows that output.
    driver.find_element("css selector", "#torchlog-search").send_keys(seconds[1] + "\n")
    wait_for(driver, f"return document.querySelector('#torchlog-panel h2')?.textContent === {seconds[1]!r}")
    assert driver.execute_script(
        "return document.querySelector('#torchlog-graph g.torchlog-selected').dataset.label") == firsts[1]
    assert _panel_rows(driver)["output of call"] == f"{firsts[1]} (output 2)"
    run_and_wait(driver, "await window.torchlogViewer.setMode('rolled');")
    rolled = driver.execute_script(
        "return [...document.querySelectorAll('#torchlog-graph g.node')].map(g => g.textContent)")
    assert sum("lstmcell" in t for t in rolled) == 1
    assert any("(x3)" in t and "2 outputs" in t for t in rolled)


class _CatFails(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.join = _Join()

    def forward(self, x):
        return self.join(self.fc(x))


class _Join(nn.Module):
    def forward(self, y):
        z = torch.relu(y)
        return torch.cat([z, y.unsqueeze(0)])  # a 2-D and a 3-D tensor


def test_the_crash_node_says_what_raised_with_which_inputs_and_search_finds_it(driver, tmp_path):
    with pytest.raises(RuntimeError) as caught:
        torchlog.log_forward_pass(_CatFails(), torch.randn(2, 4))
    history = caught.value.torchlog_history
    relu, unsqueeze = history.info.failed_parents
    _open(driver, history, tmp_path, depth=None)
    failed = '#torchlog-graph g.node[data-failed]'
    text = driver.execute_script(f"return document.querySelector('{failed}').textContent")
    assert "cat raised RuntimeError" in text and "inputs: (2, 4), (1, 2, 4)" in text
    assert _inside(driver, failed, '#torchlog-graph g.cluster[data-module="join"]')
    run_and_wait(driver, "await window.torchlogViewer.setDepth(1);")  # join collapsed
    box = driver.find_element("css selector", "#torchlog-search")
    box.send_keys("cat\n")
    wait_for(driver, "return document.querySelector('#torchlog-panel h2')?.textContent === 'forward pass failed'")
    assert _modules(driver)["join:1"] == "true" and _inside(driver, failed, '[data-module="join"]')
    rows = _panel_rows(driver)
    assert rows["function"] == "cat" and rows["in module"] == "join:1"
    # <br> apart; the arguments as recorded when cat raised, with their slots in cat's list
    assert rows["inputs"] == f"arg 0[0]: {relu} (2, 4), float32" f"arg 0[1]: {unsqueeze} (1, 2, 4), float32"
    assert "match 1 of 1" in driver.find_element("id", "torchlog-status").text
    assert driver.execute_script(
        "return document.querySelector('#torchlog-graph g.torchlog-selected')?.dataset.failed") == "true"
    # The call site is the model's own line, found here from its source, not from torchlog.
    lines, start = inspect.getsourcelines(_Join.forward)
    (number, text), = [(start + i, line.strip()) for i, line in enumerate(lines) if "torch.cat(" in line]
    where = f"{os.path.relpath(inspect.getsourcefile(_Join))}:{number} in forward"
    assert rows["call site"] == where + text  # the <code> location, then the <pre> source line
    _screenshot(driver, "crash-node-call-site")
    _search(driver, "func:cat")
    assert _panel_title(driver) == "forward pass failed"


def _search(driver, text: str) -> None:
    box = driver.find_element("css selector", "#torchlog-search")
    box.clear()
    box.send_keys(text + "\n")
    wait_for(driver, "return document.getElementById('torchlog-status').textContent"
                     f".endsWith({json.dumps(json.dumps(text))})")


def _results(driver) -> list[str]:
    return driver.execute_script(
        "const list = document.getElementById('torchlog-results');"
        "return list.hidden ? [] : [...list.querySelectorAll('li')].map(li => li.textContent);")


@pytest.mark.heavy
def test_query_search_scopes_by_module_lists_results_and_keeps_the_selection_in_the_url(
        driver, gpt2_history, tmp_path):
    from torchlog.statistics import summarize

    history = gpt2_history
    softmaxes = [r for r in history if r.func_name == "softmax"]
    in_h1 = [r.label for r in softmaxes if "h.1.attn:1" in r.containing_modules]
    assert len(softmaxes) == 2 and len(in_h1) == 1
    _open(driver, history, tmp_path, depth=1)
    for query in ("h.1.attn/softmax", "h.1.attn softmax", "in:h.1 func:softmax"):
        _search(driver, query)
        assert _panel_title(driver) == in_h1[0] and "match 1 of 1" in driver.find_element("id", "torchlog-status").text
        assert _results(driver) == []  # one result: no list needed
    _search(driver, "func:softmax shape:(1, 2, 12, 12)")
    listed = _results(driver)
    assert [text.split(" ")[0] for text in listed] == [r.label for r in softmaxes]
    assert listed[1] == f"{softmaxes[1].label} h.1 \u203a h.1.attn (1, 2, 12, 12)"
    driver.find_element("css selector", "#torchlog-results li[data-index='1']").click()
    wait_for(driver, f"return document.querySelector('#torchlog-panel h2').textContent === {softmaxes[1].label!r}")
    assert driver.execute_script("return location.hash") == "#" + softmaxes[1].label
    # Statistics: exactly the ops whose share of zeros is above 0.3.
    zeros = [r.label for r in history if r.has_saved_tensor and summarize(r.tensor_contents).zeros > 0.3]
    _search(driver, "zeros>0.3")
    assert len(zeros) > 1 and [text.split(" ")[0] for text in _results(driver)] == zeros
    _search(driver, "nan>0")
    assert "nothing matches" in driver.find_element("id", "torchlog-status").text
    # The address with the hash opens on that selection.
    url = Path(tmp_path / "page.html").resolve().as_uri() + "#" + softmaxes[1].label
    driver.get("about:blank")
    driver.get(url)
    wait_for(driver, "return document.body.dataset.ready")
    assert _panel_title(driver) == softmaxes[1].label and _modules(driver)["h.1.attn:1"] == "true"


def _fills(driver) -> dict[str, list]:
    """Drawn node key -> [fill, colour value or None]."""
    return driver.execute_script(
        "const out = {}; document.querySelectorAll('#torchlog-graph g.node').forEach(g => {"
        "  out[g.dataset.key] = [g.querySelector('polygon, ellipse').getAttribute('fill'),"
        "    g.dataset.colourValue === undefined ? null : Number(g.dataset.colourValue)]; });"
        "return out;")


def test_nodes_take_colours_from_values_given_in_python_and_from_statistics(driver, tmp_path):
    from torchlog.statistics import summarize
    from torchlog.vis.viewer import to_html

    history = _nested_history()
    values = {"linear_1_1": 0.1, "relu_1_2": 0.4, "layernorm_1_4": 2.0, "linear_3_9": 0.25}
    page = to_html(history, tmp_path / "coloured.html", depth=4, colour_by=values,  # all open
                   colour_legend="rel. diff")
    open_page(driver, page)
    assert driver.find_element("id", "torchlog-colour").get_attribute("value") == "custom"
    legend = driver.find_element("id", "torchlog-legend").text
    # The caller's numbers are measured from 0: the scale starts there, not at the smallest (0.1).
    assert legend.startswith("rel. diff") and legend.split("\n")[1:3] == ["0", "2"]
    fills = _fills(driver)
    assert {k: v for k, (_, v) in fills.items() if v is not None} == values
    assert fills["layernorm_1_4"][0] == "#7f0000" and fills["linear_1_1"][0] not in ("#fff7ec", "#f2f2f2")
    assert fills["add_1_3"][0] == "#f2f2f2"  # no value given
    lighter = [fills[k][0] for k in sorted(values, key=values.get)]
    assert lighter == sorted(lighter, key=lambda c: -sum(int(c[i:i + 2], 16) for i in (1, 3, 5)))
    # A collapsed module takes the largest value among its ops.
    run_and_wait(driver, "await window.torchlogViewer.setDepth(1);")
    fills = _fills(driver)
    assert fills["module block1:1"][1] == 2.0 and fills["module head:1"][1] == 0.25
    assert fills["module block2:1"] == ["#f2f2f2", None]
    # A statistic of the saved values, then the kinds again.
    driver.execute_script("return window.torchlogViewer.setColour('std')")
    run_and_wait(driver, "await window.torchlogViewer.setDepth(10);")
    fills = _fills(driver)
    for record in history:
        if record.has_saved_tensor and not record.is_buffer:
            assert fills[record.label][1] == pytest.approx(summarize(record.tensor_contents).std, rel=1e-6)
    assert driver.find_element("id", "torchlog-legend").text.startswith("std")
    driver.execute_script("return window.torchlogViewer.setColour('kind')")
    fills = _fills(driver)
    assert fills["linear_1_1"] == ["#d3d3d3", None] and fills["input_1_0"] == ["#98fb98", None]
    legend = driver.find_element("id", "torchlog-legend")  # back to what the kinds' fills mean
    assert legend.text.startswith("node colours") and "parameter op" in legend.text and 'class="bar"' not in legend.get_attribute("innerHTML")
    _screenshot(driver, "colour_by_kind")


def test_panels_show_histogram_axes_a_log_scale_statistics_over_passes_and_short_call_sites(driver, tmp_path):
    from torchlog.statistics import summarize

    history = torchlog.log_forward_pass(SimpleRecurrent(), torch.randn(1, 5), random_seed=0)
    _open(driver, history, tmp_path, depth=3)
    label = next(r.label for r in history if r.func_name == "linear")
    driver.execute_script(f"return window.torchlogViewer.goTo({label!r})")
    expected = summarize(history[label].tensor_contents)
    axis = driver.execute_script(
        "return [...document.querySelectorAll('#torchlog-panel svg.hist text')].map(t => t.textContent)")
    assert axis[0] == str(max(expected.counts)) and axis[1] == "0" and len(axis) == 5
    assert float(axis[2]) == pytest.approx(expected.min, rel=1e-4) and float(axis[4]) == pytest.approx(expected.max, rel=1e-4)
    heights = "return [...document.querySelectorAll('#torchlog-panel svg.hist rect')].map(r => Number(r.getAttribute('height')))"
    linear = driver.execute_script(heights)
    driver.find_element("id", "torchlog-hist-log").click()
    logged = driver.execute_script(heights)
    nonzero = [i for i, c in enumerate(expected.counts) if c]
    smallest = min(nonzero, key=lambda i: expected.counts[i])
    tallest = max(nonzero, key=lambda i: expected.counts[i])
    assert logged[tallest] == pytest.approx(linear[tallest])  # the tallest bar keeps its height
    if expected.counts[smallest] < expected.counts[tallest]:
        assert logged[smallest] > linear[smallest]  # the others grow on a log scale
    site = _panel_rows(driver)["call site"]
    assert site.startswith("tests/models.py:") and not site.startswith("/")
    # A rolled layer: its statistics over the passes, one mark per pass.
    run_and_wait(driver, "await window.torchlogViewer.setMode('rolled');")
    layer = history.layers[1]
    driver.execute_script(f"return window.torchlogViewer.goTo({layer.label!r})")
    marks = driver.execute_script(
        "const svg = document.querySelector('#torchlog-panel svg.passes');"
        "return svg && [svg.querySelectorAll('circle.min').length, svg.querySelector('polyline.mean').getAttribute('points').split(' ').length,"
        " [...svg.querySelectorAll('rect.hit title')].map(t => t.textContent)];")
    assert marks[0] == marks[1] == len(layer.passes) > 1
    first = summarize(layer.passes[0].tensor_contents)
    assert marks[2][0].startswith("pass 1: mean ") and f"{first.max:.5g}"[:5] in marks[2][0]


@pytest.mark.heavy
def test_an_attention_map_has_a_heatmap_in_its_panel(driver, gpt2_history, tmp_path):
    history = gpt2_history
    softmax = next(r for r in history if r.func_name == "softmax")
    plane = softmax.tensor_contents[0, 0].double()
    assert softmax.tensor_contents.dim() == 4 and plane.shape[0] >= 8
    _open(driver, history, tmp_path, depth=1)
    driver.execute_script(f"return window.torchlogViewer.goTo({softmax.label!r})")
    shown = driver.execute_script(
        "const img = document.querySelector('#torchlog-panel .heat img');"
        "return img && [img.dataset.rows, img.dataset.cols, img.naturalWidth, img.naturalHeight,"
        " document.querySelector('#torchlog-panel .heat .legend').textContent];")
    rows, cols = plane.shape
    assert shown[:4] == [str(rows), str(cols), cols, rows]
    assert shown[4] == f"slice [0, 0, :, :] of (1, 2, {rows}, {cols})"
    cells = driver.execute_script(
        f"const p = window.torchlogViewer.data.passes.find(p => p.label === {softmax.label!r});"
        "return [...atob(p.stats.heat.cells)].map(c => c.charCodeAt(0));")
    lo, hi = plane.min().item(), plane.max().item()
    expected = ((plane - lo) / (hi - lo) * 255).round().reshape(-1).tolist()
    assert max(abs(a - b) for a, b in zip(cells, expected)) <= 1
    _screenshot(driver, "gpt2_attention_heatmap")


class _LSTMSteps(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(4, 8)

    def forward(self, x):
        h = c = torch.zeros(1, 8)
        for _ in range(8):
            h, c = self.cell(x, (h, c))
        return h


def test_rolled_edge_labels_overlap_no_node_or_box_title(driver, tmp_path):
    history = torchlog.log_forward_pass(_LSTMSteps(), torch.randn(1, 4), random_seed=0)
    _open(driver, history, tmp_path, mode="rolled", depth=2)
    overlaps = driver.execute_script(  # edge text against nodes, box titles and other edges' text
        "const rect = (el) => el.getBoundingClientRect();"
        "const things = [...document.querySelectorAll('#torchlog-graph g.node, #torchlog-graph g.cluster > text')]"
        "  .map(g => [g.dataset.key || g.parentNode.dataset.key, rect(g)]);"
        "const texts = [...document.querySelectorAll('#torchlog-graph g.edge text')]"
        "  .map(t => [t.closest('g.edge').id, rect(t), t.textContent]);"
        "const out = [];"
        "for (const [edge, a, text] of texts) {"
        "  for (const [key, b] of things.concat(texts.filter(([other]) => other !== edge))) {"
        "    const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);"
        "    const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);"
        "    if (w > 1 && h > 1) out.push([text, key]);"
        "  }"
        "}"
        "return out;")
    assert overlaps == []
    text = driver.execute_script("return document.querySelector('#torchlog-graph svg').textContent")
    assert "Out 1-7, In 2-8" in text
    _screenshot(driver, "lstm_cell_rolled")
