"""The viewer's first view in Chromium: module titles readable at every zoom, values read by a
chain of blocks drawn as markers, a frame with no size, bad URL hashes, histories without values.

Which modules exist comes from the history (Python), never from the page's own tables.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchlog
from tests.vis.browser import open_page, run_and_wait, start_browser, wait_for

pytestmark = pytest.mark.browser
# A title is readable on screen from this height (px) of its drawn text.
READABLE_PX = 8


@pytest.fixture(scope="module")
def driver():
    browser = start_browser()
    yield browser
    browser.quit()


def gpt2_history(layers: int, head: bool = False) -> torchlog.ModelHistory:
    """A small GPT-2 (transformers' own code, a config built here, nothing downloaded)."""
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model

    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
                        bos_token_id=99, eos_token_id=99, attn_implementation="eager")
    model = (GPT2LMHeadModel if head else GPT2Model)(config).eval()
    return torchlog.log_forward_pass(model, torch.randint(0, 100, (1, 12)), random_seed=0)


class BasicBlock(nn.Module):
    """ResNet-18's block: two 3x3 convolutions and a shortcut (a 1x1 convolution when the
    shape changes)."""

    def __init__(self, channels_in: int, channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample = None
        if stride != 1 or channels_in != channels:
            self.downsample = nn.Sequential(nn.Conv2d(channels_in, channels, 1, stride, bias=False),
                                            nn.BatchNorm2d(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class SmallResNet(nn.Module):
    """ResNet-18's layout (a stem, four stages of two blocks, a pooled classifier), narrow."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        channels = width
        for stage, out in enumerate((width, 2 * width, 4 * width, 8 * width), start=1):
            stride = 1 if stage == 1 else 2
            setattr(self, f"layer{stage}", nn.Sequential(BasicBlock(channels, out, stride), BasicBlock(out, out, 1)))
            channels = out
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet_history() -> torchlog.ModelHistory:
    torch.manual_seed(0)
    return torchlog.log_forward_pass(SmallResNet().eval(), torch.randn(1, 3, 32, 32), random_seed=0)


# Each drawn module (node or box, or run of repeated blocks): its address (the run's first),
# whether it is expanded, and the on-screen height and text of its displayed titles.
MODULE_TITLES = """
return [...document.querySelectorAll('#torchlog-graph [data-module], #torchlog-graph [data-repeat]')].map(g => {
  const shown = [...g.querySelectorAll(':scope > text')].filter(t => getComputedStyle(t).display !== 'none'
      && t.textContent.trim());
  return [g.dataset.module || g.dataset.repeat.split(' ')[0], g.dataset.expanded || 'false',
          shown.map(t => [t.getBoundingClientRect().height, t.textContent])];
});"""


def _module_titles(driver) -> list:
    return driver.execute_script(MODULE_TITLES)


def _drawn_modules(history: torchlog.ModelHistory) -> set[str]:
    return {address for r in history for address in (c.rsplit(":", 1)[0] for c in r.containing_modules)}


@pytest.mark.heavy
@pytest.mark.parametrize(("build", "module"), [(lambda: gpt2_history(12), "ln_f"), (resnet_history, "layer2")],
                         ids=["gpt2-12-layers", "resnet18"])
def test_the_first_view_titles_every_module_readably(driver, tmp_path, build, module):
    history = build()
    open_page(driver, history.to_html(tmp_path / "page.html"))
    titles = _module_titles(driver)
    assert len([t for t in titles if t[0] in _drawn_modules(history)]) >= 5  # the model's parts, not one wrapper
    unreadable = [(m, shown) for m, _, shown in titles if not shown or max(h for h, _ in shown) < READABLE_PX]
    assert unreadable == []
    # The title shown names the module itself (its address, not a bare index), with its type
    # once the text is large enough for the whole line.
    driver.execute_script("window.torchlogViewer.zoomBy(4)")
    full = {m: [text for _, text in shown] for m, _, shown in _module_titles(driver)}
    assert any(text.endswith(f"{module} ({history.modules[module].type_name})") for text in full[module])


@pytest.mark.heavy
def test_twelve_blocks_in_a_row_open_as_one_node_that_a_click_draws_again(driver, tmp_path):
    history = gpt2_history(12)
    open_page(driver, history.to_html(tmp_path / "gpt2.html"))
    blocks = [f"h.{i}" for i in range(12)]
    assert all(history.modules[b].type_name == "GPT2Block" for b in blocks)
    run = driver.execute_script(
        "const g = document.querySelector('#torchlog-graph g.node[data-repeat]');"
        "const r = g.getBoundingClientRect(); return [g.dataset.repeat, g.dataset.key, g.textContent, r.left, r.top];")
    assert run[0].split() == blocks and "h.0 \u2026 h.11 (12\u00d7 GPT2Block)" in run[2]
    assert driver.execute_script("return document.getElementById('torchlog-repeats').checked") is True
    outside = driver.execute_script(  # folded, the whole model fits the window
        "const a = document.getElementById('torchlog-graph').getBoundingClientRect();"
        "return [...document.querySelectorAll('#torchlog-graph g.node')].filter(n => { const r = n.getBoundingClientRect();"
        " return r.left < a.left - 1 || r.right > a.right + 1 || r.top < a.top - 1 || r.bottom > a.bottom + 1; }).length")
    assert outside == 0
    run_and_wait(driver, f"await window.torchlogViewer.unfoldRun({run[1]!r});")
    drawn = [m for m, _, _ in _module_titles(driver) if m.startswith("h.")]
    assert drawn == blocks
    first = driver.execute_script(
        "const r = document.querySelector('#torchlog-graph g.node[data-module=\"h.0\"]').getBoundingClientRect();"
        "return [r.left, r.top];")
    assert first == pytest.approx(run[3:], abs=1)  # the first block where the run was
    run_and_wait(driver, "await window.torchlogViewer.setRepeats(false);")
    assert driver.find_elements("css selector", "#torchlog-graph g.node[data-repeat]") == []


@pytest.mark.heavy
def test_a_value_read_by_every_block_is_a_marker_on_each_not_a_rail(driver, tmp_path):
    history = gpt2_history(12)
    open_page(driver, history.to_html(tmp_path / "gpt2.html", depth=1))
    mask_users = {c.rsplit(":", 1)[0] for r in history for p in r.parents
                  if "masking_utils" in (history[p.label].call_site or "") for c in r.containing_modules[-1:]}
    assert {f"h.{i}" for i in range(12)} <= mask_users  # every block reads the mask
    drawn = driver.execute_script(
        "const v = window.torchlogViewer.state.drawn;"
        "return {edges: v.edges.map(e => [e.tail, e.head]),"
        "        markers: [...document.querySelectorAll('#torchlog-graph g.torchlog-marker')].map(g => [g.dataset.from, g.dataset.to])};")
    mask = "module masking_utils:1"
    assert [head for tail, head in drawn["edges"] if tail == mask] == ["module h.0:1"]
    assert sorted(to for frm, to in drawn["markers"] if frm == mask) == sorted(f"module h.{i}:1" for i in range(1, 12))
    # The blocks draw as a chain: one above the other, not a staircase.
    centres = driver.execute_script(
        "return [...Array(12).keys()].map(i => {"
        "  const r = document.querySelector(`#torchlog-graph g.node[data-module='h.${i}']`).getBoundingClientRect();"
        "  return [r.left + r.width / 2, r.top]; });")
    assert max(x for x, _ in centres) - min(x for x, _ in centres) < 2
    assert all(a[1] < b[1] for a, b in zip(centres, centres[1:]))
    # A marker leads to the value it stands for.
    driver.execute_script("document.querySelector('#torchlog-graph g.torchlog-marker').dispatchEvent("
                          "new MouseEvent('click', {bubbles: true}))")
    assert driver.execute_script("return window.torchlogViewer.state.selected") == mask


class Branches(nn.Module):
    """One value read by three parallel branches: real data flow, drawn as edges."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.a(x), self.b(x), self.c(x)], dim=1)


def test_parallel_branches_keep_their_edges(driver, tmp_path):
    history = torchlog.log_forward_pass(Branches(), torch.randn(2, 4), random_seed=0)
    open_page(driver, history.to_html(tmp_path / "branches.html", depth=1))
    found = driver.execute_script(
        "return [document.querySelectorAll('#torchlog-graph g.torchlog-marker').length,"
        " window.torchlogViewer.state.drawn.edges.filter(e => e.tail === 'input_1_0').length]")
    assert found == [0, 3]


def _tiny_history(**options) -> torchlog.ModelHistory:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.Tanh()), nn.Linear(8, 2))
    return torchlog.log_forward_pass(model, torch.randn(3, 4), random_seed=0, **options)


@pytest.mark.heavy
def test_a_frame_without_a_size_opens_readable_once_it_gets_one(driver, tmp_path):
    """A notebook output that is collapsed (or a background tab) gives the page no size."""
    import html

    page = gpt2_history(4).to_html(tmp_path / "gpt2.html")
    host = tmp_path / "host.html"
    host.write_text(f'<!DOCTYPE html><body style="margin:0"><iframe id="frame" style="width:1000px; height:700px; '
                    f'border:0; display:none" srcdoc="{html.escape(Path(page).read_text(), quote=True)}"></iframe></body>')
    driver.get(host.as_uri())
    inner = "document.getElementById('frame').contentWindow"
    wait_for(driver, f"return {inner}.torchlogViewer && {inner}.document.body.dataset.renders >= '1'")
    driver.execute_script("return new Promise(r => setTimeout(r, 500))")
    assert driver.execute_script(f"return {inner}.document.body.dataset.ready") is None  # it waits
    driver.execute_script("document.getElementById('frame').style.display = 'block'")
    wait_for(driver, f"return {inner}.document.body.dataset.ready === 'true'")
    view = driver.execute_script(f"return {inner}.torchlogViewer.state.view")
    assert view is not None and all(isinstance(v, (int, float)) for v in view)
    sizes = driver.execute_script(
        f"const d = {inner}.document; return [...d.querySelectorAll('#torchlog-graph [data-module]')].map(g =>"
        " Math.max(0, ...[...g.querySelectorAll(':scope > text')].filter(t => getComputedStyle(t).display !== 'none')"
        "  .map(t => t.getBoundingClientRect().height)));")
    assert len(sizes) >= 6 and min(sizes) >= READABLE_PX


def test_a_link_to_a_label_the_history_lacks_says_so(driver, tmp_path):
    history = _tiny_history()
    page = Path(history.to_html(tmp_path / "page.html"))
    for missing in ("softmax_9_99", "module=decoder.7"):
        driver.get(page.as_uri() + "#" + missing)
        wait_for(driver, "return document.body.dataset.ready")
        driver.refresh()  # a hash change alone does not reload the page
        wait_for(driver, "return document.body.dataset.ready")
        status = driver.find_element("id", "torchlog-status")
        assert "not in this history" in status.text and "error" in status.get_attribute("class")
        assert missing in driver.find_element("id", "torchlog-unknown-hash").text
    driver.get(page.as_uri() + "#" + history[2].label)  # an existing one opens on it
    driver.refresh()
    wait_for(driver, "return document.body.dataset.ready")
    assert driver.execute_script("return window.torchlogViewer.state.selected") == history[2].label
    # Its call site's line number is never split across lines, and the panel starts at the top.
    lines = driver.execute_script(
        "return [...document.querySelectorAll('#torchlog-panel code .line')].map(s => s.getClientRects().length)")
    assert lines and set(lines) == {1}
    assert driver.execute_script("return document.getElementById('torchlog-panel').scrollTop") == 0


def test_a_history_without_values_shows_its_structure_and_says_why_no_statistics(driver, tmp_path):
    history = _tiny_history(layers_to_save=None)
    assert history.num_saved == 0
    open_page(driver, history.to_html(tmp_path / "bare.html"))
    assert driver.execute_script("return document.querySelectorAll('#torchlog-graph g.node').length") >= 4
    assert "layers_to_save=None" in driver.find_element("id", "torchlog-panel").text
    disabled = driver.execute_script(
        "return [...document.querySelectorAll('#torchlog-colour option')].filter(o => o.disabled).map(o => o.value)")
    assert set(disabled) == {"std", "zeros", "naninf", "absmax"}
    driver.execute_async_script("const done = arguments[arguments.length - 1];"
                                f"window.torchlogViewer.goTo({history[2].label!r}).then(done);")
    assert "saved no activations" in driver.find_element("id", "torchlog-panel").text


# Screen rectangles of the drawn nodes and boxes, by key.
PLACES = """
const out = {};
document.querySelectorAll('#torchlog-graph g.node[data-key], #torchlog-graph g.cluster[data-key]').forEach(g => {
  const r = g.getBoundingClientRect(); out[g.dataset.key] = [r.left, r.top, r.width, r.height]; });
return out;"""


def _settle(driver) -> None:
    driver.execute_script("return Promise.all(document.getAnimations().map(a => a.finished))")


@pytest.mark.heavy
def test_an_expand_keeps_what_is_above_and_moves_what_is_below_together(driver, tmp_path):
    history = gpt2_history(4)
    open_page(driver, history.to_html(tmp_path / "gpt2.html", depth=1))
    before = driver.execute_script(PLACES)
    node = before["module h.1:1"]
    run_and_wait(driver, "await window.torchlogViewer.toggleModule('h.1');")
    _settle(driver)
    after = driver.execute_script(PLACES)
    box = after["h.1:1"]
    assert box[0] == pytest.approx(node[0], abs=1) and box[1] == pytest.approx(node[1], abs=1)
    above = [k for k, r in before.items() if r[1] + r[3] <= node[1] + 0.5]
    below = [k for k, r in before.items() if r[1] >= node[1] + node[3] - 0.5]
    assert {"module h.0:1", "module wte:1"} <= set(above) and {"module h.2:1", "module h.3:1"} <= set(below)
    for key in above:
        assert after[key][:2] == pytest.approx(before[key][:2], abs=1), key
    moves = {key: (after[key][0] - before[key][0], after[key][1] - before[key][1]) for key in below}
    dy = moves["module h.2:1"][1]
    assert dy == pytest.approx(box[3] - node[3], abs=2)
    for key, (mx, my) in moves.items():
        assert mx == pytest.approx(0, abs=1) and my == pytest.approx(dy, abs=1), key
    # Nothing outside the box overlaps it.
    inside = set(driver.execute_script(
        "return [...document.querySelectorAll('#torchlog-graph g.node[data-key]')]"
        ".filter(g => window.torchlogViewer.state.drawn.placed.units.get(g.dataset.key).boxes.includes('h.1:1'))"
        ".map(g => g.dataset.key)"))
    assert inside
    for key, r in after.items():
        if key in inside or key == "h.1:1":
            continue
        apart = r[0] >= box[0] + box[2] - 1 or r[0] + r[2] <= box[0] + 1 or r[1] >= box[1] + box[3] - 1 or r[1] + r[3] <= box[1] + 1
        assert apart, key
    # Closing it again puts everything back.
    run_and_wait(driver, "await window.torchlogViewer.toggleModule('h.1');")
    _settle(driver)
    again = driver.execute_script(PLACES)
    for key, r in before.items():
        assert again[key][:2] == pytest.approx(r[:2], abs=1), key


def test_a_legend_names_the_kind_colours_and_keys_move_the_selection(driver, tmp_path):
    from selenium.webdriver import ActionChains
    from selenium.webdriver.common.keys import Keys

    history = _tiny_history()
    open_page(driver, history.to_html(tmp_path / "keys.html"))
    legend = driver.execute_script(
        "const l = document.getElementById('torchlog-legend');"
        "return [l.hidden, [...l.querySelectorAll('[data-kind]')].map(d => [d.dataset.kind, d.textContent.trim(),"
        " getComputedStyle(d.querySelector('i')).backgroundColor])]")
    kinds = {kind: (text, colour) for kind, text, colour in legend[1]}
    assert legend[0] is False and {"input", "output", "param"} <= set(kinds)
    assert kinds["input"] == ("input", "rgb(152, 251, 152)")  # #98FB98, the input's fill
    first = next(r for r in history if r.func_name == "linear")
    child = history[first.children[0]]
    driver.execute_async_script("const done = arguments[arguments.length - 1];"
                                f"window.torchlogViewer.goTo({first.label!r}).then(done);")
    selected = lambda: driver.execute_script("return window.torchlogViewer.state.selected")  # noqa: E731
    ActionChains(driver).send_keys(Keys.ARROW_DOWN).perform()
    assert selected() == child.label
    ActionChains(driver).send_keys(Keys.ARROW_UP).perform()
    assert selected() == first.label
    ActionChains(driver).send_keys("/").perform()
    assert driver.execute_script("return document.activeElement.id") == "torchlog-search"
    ActionChains(driver).send_keys(Keys.ESCAPE).perform()  # leaves the box
    assert driver.execute_script("return document.activeElement.id") != "torchlog-search"
    ActionChains(driver).send_keys(Keys.ESCAPE).perform()  # clears the selection
    assert selected() is None and driver.find_element("id", "torchlog-panel").text == ""
