"""PatchResult.to_html in headless Chromium: a patched pass's panel shows the clean and corrupted
runs' metrics and its effect per position as bars, the page has the grid of effects (a row per
patched pass, a column per position), and the colour scale starts at 0; every figure is checked
against plain forwards with a patching hook."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from tests.vis.browser import open_page, start_browser, wait_for
from torchlog.patching import sweep

pytestmark = pytest.mark.browser

POSITIONS = [0, 1, 2, 3, 4]
BLOCKS = ["blocks.0", "blocks.1", "blocks.2"]


class Mixer(nn.Module):
    """Blocks over (batch, tokens, hidden) whose outputs are summed along the tokens, so every
    position of every block moves the metric, some up and some down."""

    def __init__(self, hidden: int = 6) -> None:
        super().__init__()
        self.embed = nn.Linear(4, hidden)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh()) for _ in BLOCKS)
        self.head = nn.Linear(hidden, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = h + block(h).cumsum(dim=1) * 0.3
        return self.head(h)


def _metric(out: torch.Tensor) -> torch.Tensor:
    return out[:, -1, 0].sum() - out[:, -1, 1].sum()


def _oracle(model: nn.Module, clean: torch.Tensor, corrupted: torch.Tensor) -> dict[str, Any]:
    """Clean and corrupted metrics, and each block's effect per position, from plain forwards
    whose forward hook writes the clean output of the block at one position."""
    outputs = {}
    hooks = [model.get_submodule(a).register_forward_hook(
        lambda m, args, out, a=a: outputs.setdefault(a, out.detach().clone())) for a in BLOCKS]
    with torch.no_grad():
        clean_m = float(_metric(model(clean)))
        for hook in hooks:
            hook.remove()
        corrupted_m = float(_metric(model(corrupted)))
    effects = {}
    for address in BLOCKS:
        for position in POSITIONS:
            def patch(module, args, out, value=outputs[address], at=position):
                new = out.clone()
                new[:, at] = value[:, at]
                return new
            handle = model.get_submodule(address).register_forward_hook(patch)
            with torch.no_grad():
                metric = float(_metric(model(corrupted)))
            handle.remove()
            effects[address, position] = (metric - corrupted_m) / (clean_m - corrupted_m)
    return {"clean": clean_m, "corrupted": corrupted_m, "effects": effects}


_PANEL = """
const panel = document.getElementById('torchlog-panel');
const tables = {};
panel.querySelectorAll('section.torchlog-section').forEach(s => { const rows = {};
  s.querySelectorAll('tr').forEach(tr => { const [k, v] = tr.querySelectorAll('td'); rows[k.textContent] = v.textContent; });
  tables[s.dataset.title] = rows; });
const bars = {};
panel.querySelectorAll('section.torchlog-bars').forEach(s => {
  bars[s.dataset.title] = [...s.querySelectorAll('tr')].map(tr => [tr.dataset.name, Number(tr.dataset.value),
    Number(tr.querySelector('rect').getAttribute('width'))]); });
const cells = [...panel.querySelectorAll('#torchlog-grid rect[data-row]')].map(r =>
  [r.dataset.row, r.dataset.column, r.dataset.value === '' ? null : Number(r.dataset.value), r.getAttribute('fill')]);
const ends = [...panel.querySelectorAll('#torchlog-grid .ends span')].map(s => s.textContent);
const legend = [...document.querySelectorAll('#torchlog-legend .ends span')].map(s => s.textContent);
return {label: panel.querySelector('h2').textContent, tables, bars, cells, ends, legend};
"""


@pytest.fixture(scope="module")
def patched() -> tuple[Any, dict[str, Any]]:
    torch.manual_seed(0)
    model, clean, corrupted = Mixer().eval(), torch.randn(1, 5, 4), torch.randn(1, 5, 4)
    result = sweep(model, clean, corrupted, BLOCKS, _metric, positions=POSITIONS, progress=False)
    return result, _oracle(model, clean, corrupted)


def test_the_panel_bars_and_grid_of_a_sweep_match_hooked_forwards(patched, tmp_path) -> None:
    result, oracle = patched
    labels = {row.module: row.label for row in result}
    assert set(labels) == set(BLOCKS)
    effects = oracle["effects"].values()
    assert min(effects) < 0 < max(effects)  # both signs: a symmetric scale
    driver = start_browser()
    try:
        open_page(driver, result.to_html(str(tmp_path / "patched.html")))
        opened = driver.execute_script(_PANEL)
        other = next(label for label in labels.values() if label != opened["label"])
        driver.execute_script(f"document.querySelector('#torchlog-grid rect[data-row=\"{other}\"]').dispatchEvent("
                              "new MouseEvent('click', {bubbles: true}))")
        wait_for(driver, f"return document.querySelector('#torchlog-panel h2')?.textContent === '{other}'")
        clicked = driver.execute_script(_PANEL)
    finally:
        driver.quit()
    address = {label: module for module, label in labels.items()}
    largest = max(oracle["effects"], key=lambda key: abs(oracle["effects"][key]))
    assert opened["label"] == labels[largest[0]]  # opened on the pass of largest |effect|
    for shown in (opened, clicked):
        table = shown["tables"]["patching (sweep)"]
        assert float(table["clean run's metric"]) == pytest.approx(oracle["clean"], rel=1e-4)
        assert float(table["corrupted run's metric"]) == pytest.approx(oracle["corrupted"], rel=1e-4)
        bars = shown["bars"]["effect by position"]
        assert [name for name, _, _ in bars] == [str(p) for p in POSITIONS]
        want = [oracle["effects"][address[shown["label"]], p] for p in POSITIONS]
        assert [value for _, value, _ in bars] == pytest.approx(want, rel=1e-4, abs=1e-6)
        # Bars drawn from 0: lengths in proportion to |effect|.
        widths = [width for _, _, width in bars]
        peak = max(abs(w) for w in want)
        assert widths == pytest.approx([abs(w) / peak * max(widths) for w in want], abs=0.15)
        grid = {(row, int(column)): (value, fill) for row, column, value, fill in shown["cells"]}
        assert set(grid) == {(label, p) for label in labels.values() for p in POSITIONS}
        for (row, position), (value, _) in grid.items():
            assert value == pytest.approx(oracle["effects"][address[row], position], rel=1e-4, abs=1e-6)
    m = max(abs(e) for e in effects)
    assert [float(v) for v in opened["ends"]] == pytest.approx([-m, m], rel=1e-4)  # symmetric around 0
    node_peak = max(abs(e) for e in result.effects().values())
    assert [float(v) for v in opened["legend"]] == pytest.approx([-node_peak, node_peak], rel=1e-4)


def test_a_one_signed_scale_starts_at_0(tmp_path) -> None:
    torch.manual_seed(0)
    model, clean, corrupted = Mixer().eval(), torch.randn(1, 5, 4), torch.randn(1, 5, 4)
    result = sweep(model, clean, corrupted, BLOCKS, _metric, progress=False)  # whole values
    oracle = {row.label: row.effect for row in result}
    assert min(oracle.values()) > 0  # every block's whole value moves the metric toward clean
    driver = start_browser()
    try:
        open_page(driver, result.to_html(str(tmp_path / "whole.html")))
        shown = driver.execute_script(_PANEL)
    finally:
        driver.quit()
    assert [float(v) for v in shown["legend"]] == pytest.approx([0.0, max(oracle.values())], rel=1e-4, abs=1e-9)
    assert [float(v) for v in shown["ends"]] == pytest.approx([0.0, max(oracle.values())], rel=1e-4, abs=1e-9)
    assert {(row, column) for row, column, _, _ in shown["cells"]} == {(label, "whole value") for label in oracle}
    assert float(shown["tables"]["patching (sweep)"]["effect"]) == pytest.approx(oracle[shown["label"]], rel=1e-4)
