"""The panel of an intervened pass draws the value before the action and after it: both
histograms on one value axis, and the 2-D slice the action acted on (the ablated head, not
head 0) before and after, on one scale; checked in headless Chromium against plain PyTorch."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlog
from tests.vis.browser import open_page, start_browser, wait_for
from torchlog.interventions import scale, zero_ablate
from torchlog.statistics import NUM_BINS

HEAD = 2


class Attention(nn.Module):
    """Attention probabilities of 4 heads over 12 tokens: (1, 4, 12, 12)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(8, 32), nn.Linear(8, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q(x).view(1, 12, 4, 8).transpose(1, 2)
        k = self.k(x).view(1, 12, 4, 8).transpose(1, 2)
        return (q @ k.transpose(-1, -2)).softmax(-1) * 3.0


# The cells of a panel picture, read back from its pixels: each pixel's nearest colour on the
# ramp of the scale bar drawn under it gives its byte (0 is data-lo, 255 data-hi).
_CELLS = """
const img = document.querySelector(arguments[0]);
const stops = img.closest('.heat').querySelector('.bar').getAttribute('style').match(/#[0-9a-f]{6}/gi)
  .map(h => [1, 3, 5].map(i => parseInt(h.slice(i, i + 2), 16)));
const rampAt = (t) => { const x = t * (stops.length - 1), i = Math.min(stops.length - 2, Math.floor(x)), f = x - i;
  return stops[i].map((v, c) => Math.round(v + (stops[i + 1][c] - v) * f)); };
const canvas = document.createElement('canvas');
canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
const ctx = canvas.getContext('2d'); ctx.drawImage(img, 0, 0);
const data = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
const ramp = [...Array(256).keys()].map(k => rampAt(k / 255));
const lo = Number(img.dataset.lo), hi = Number(img.dataset.hi), out = [];
for (let i = 0; i < data.length; i += 4) {
  let best = 0, dist = Infinity;
  ramp.forEach(([r, g, b], k) => { const d = (r - data[i]) ** 2 + (g - data[i + 1]) ** 2 + (b - data[i + 2]) ** 2;
    if (d < dist) { dist = d; best = k; } });
  out.push(lo + best / 255 * (hi - lo));
}
return [canvas.width, canvas.height, lo, hi, out];
"""
_HISTOGRAMS = """
return ['before', 'after'].map(name => { const svg = document.querySelector(`svg.hist[data-name="${name}"]`);
  return [[...svg.querySelectorAll('rect[data-count]')].map(r => Number(r.dataset.count)),
          [...svg.querySelectorAll('text')].slice(2).map(t => t.textContent)]; });
"""


def _counts(value: torch.Tensor) -> list[int]:
    x = value.detach().double().reshape(-1)
    return [int(c) for c in torch.histc(x, bins=NUM_BINS, min=float(x.min()), max=float(x.max()))]


@pytest.mark.browser
def test_the_panel_shows_the_ablated_head_and_both_histograms(tmp_path) -> None:
    torch.manual_seed(0)
    model, x = Attention(), torch.randn(1, 12, 8)
    history = torchlog.log_forward_pass(model, x, intervene={"softmax_1_9": zero_ablate(index=(slice(None), HEAD))})
    assert [r.label for r in history if r.extra.get("interventions")] == ["softmax_1_9"]
    with torch.no_grad():
        q = model.q(x).view(1, 12, 4, 8).transpose(1, 2)
        k = model.k(x).view(1, 12, 4, 8).transpose(1, 2)
        before = (q @ k.transpose(-1, -2)).softmax(-1)
    after = before.clone()
    after[:, HEAD] = 0.0
    driver = start_browser()
    try:
        open_page(driver, history.to_html(tmp_path / "ablated.html", depth=1))
        driver.execute_script("window.location.hash = '#softmax_1_9'")
        wait_for(driver, "const i = document.querySelectorAll('#torchlog-panel .acted img');"
                         "return i.length === 2 && [...i].every(img => img.complete)", 20)
        where = driver.execute_script("return document.querySelector('#torchlog-panel .acted').dataset.slice")
        shown = {name: driver.execute_script(_CELLS, f"#torchlog-panel .acted figure[data-name={name}] img")
                 for name in ("before", "after")}
        histograms = driver.execute_script(_HISTOGRAMS)
        picked = driver.execute_script(  # the value's own heatmap opens on the acted-on head too
            "const h = document.querySelector('#torchlog-panel .heat:not(.acted)');"
            "return [h.querySelector('select').value, h.querySelector('img').dataset.slice];")
    finally:
        driver.quit()
    assert where == f"[0, {HEAD}, :, :]" and picked == [str(HEAD), str(HEAD)]
    lo, hi = float(before[0, HEAD].min()), float(before[0, HEAD].max())  # 0 is inside: one scale
    for name, want in (("before", before[0, HEAD]), ("after", after[0, HEAD])):
        cols, rows, shown_lo, shown_hi, cells = shown[name]
        # The record keeps the slice's means to four significant digits.
        assert (rows, cols) == (12, 12) and (shown_lo, shown_hi) == pytest.approx((min(lo, 0.0), hi), rel=1e-3)
        step = (hi - min(lo, 0.0)) / 255
        assert cells == pytest.approx(want.reshape(-1).tolist(), abs=1.5 * step), name
    assert max(shown["before"][4]) > 10 * step  # the ablated head's own picture, not a zero one
    for (counts, ticks), value in zip(histograms, (before, after)):
        want = _counts(value)
        assert sum(counts) == sum(want) == value.numel()
        assert max(abs(c - w) for c, w in zip(counts, want)) <= 1  # a value on a bin's edge may go either way
        axis = (min(float(before.min()), float(after.min())), max(float(before.max()), float(after.max())))
        assert (float(ticks[0]), float(ticks[2])) == pytest.approx(axis, rel=1e-4, abs=1e-7)  # one value axis


def _window_means(plane: torch.Tensor, side: int) -> list[float]:
    """Means over the cells adaptive pooling covers (start floor(i n / m), end ceil((i + 1) n / m))."""
    rows, cols = plane.shape
    out_r, out_c = min(rows, side), min(cols, side)
    means = []
    for i in range(out_r):
        r0, r1 = (i * rows) // out_r, -((-(i + 1) * rows) // out_r)
        for j in range(out_c):
            c0, c1 = (j * cols) // out_c, -((-(j + 1) * cols) // out_c)
            means.append(float(plane[r0:r1, c0:c1].double().mean()))
    return means


@pytest.mark.parametrize("index, lead", [((1, slice(None), 2), (1, 0, 2)), ((slice(None), torch.tensor([2, 1])), (0, 1, 0)),
                                         (None, (0, 0, 0)), ((Ellipsis, slice(3, 5), slice(None)), (0, 0, 0))])
def test_the_record_keeps_the_acted_slice_as_cell_means(index, lead) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 40, 36)
    history = torchlog.log_forward_pass(_Tanh(), x, intervene={"tanh_1_1": scale(2.0, index=index)})
    before = history.interventions[0].before
    assert before["slice"] == lead
    plane = before["plane"]
    assert (plane["rows"], plane["cols"]) == (32, 32)
    assert list(plane["means"]) == pytest.approx(_window_means(torch.tanh(x)[lead], 32), rel=1e-3, abs=1e-6)
    assert sum(before["counts"]) == x.numel()


class _Tanh(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x)
