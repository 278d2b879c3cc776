"""A 2-D picture of a saved value for the panel: an attention map, an image channel, a
(sequence, features) activation, at most HEAT_SIDE cells a side, one byte a cell."""
from __future__ import annotations

import base64
import math
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["HEAT_SIDE", "MAX_SLICES", "MIN_SIDE", "acted_heatmap", "heatmap", "heatmaps"]

HEAT_SIDE = 32  # cells a side at most; larger slices are averaged down
MIN_SIDE = 8  # both of the last two dimensions at least this, or no picture
MAX_SLICES = 16  # slices along the dimension before the last two (heads, channels) at most


def heatmap(value: Any) -> dict[str, Any] | None:
    """2-D slices of `value` as heatmaps: the first (index 0 on every leading dimension), and
    for a value of three or more dimensions up to MAX_SLICES along the one before the last two
    (an attention map's heads, an image's channels) in `more`.

    Returns None when `value` is not a tensor of two or more dimensions whose last two are at
    least MIN_SIDE, or when the first slice holds no finite value. Each picture has its own
    scale: `cells` is base64 of rows x cols bytes, row by row, 0 is `lo`, 255 is `hi`,
    linearly; a cell averages the values it covers (NaN, Inf and a mask's fills, the dtype's
    finfo.min and finfo.max, left out; a cell with none is 0 and, when there is one, `holes`
    (base64, a byte per cell) marks it 1). `slice` says which slice of the value's `shape` the
    first is; `along` is the dimension `more` steps along (slice i is index i there), absent
    without `more`; a slice with no finite value is None in `more`.

    Example:
        >>> h = heatmap(torch.arange(100.0).reshape(1, 10, 10))
        >>> h["slice"], h["shape"], h["rows"], h["cols"], h["lo"], h["hi"]
        ('[0, :, :]', [1, 10, 10], 10, 10, 0.0, 99.0)
        >>> h = heatmap(torch.arange(300.0).reshape(1, 3, 10, 10))
        >>> h["along"], len(h["more"]), h["more"][1]["lo"]
        (1, 2, 200.0)
    """
    if not isinstance(value, torch.Tensor) or value.dim() < 2:
        return None
    rows, cols = value.shape[-2:]
    if rows < MIN_SIDE or cols < MIN_SIDE:
        return None
    lead = (0,) * (value.dim() - 2)
    first = _picture(value.detach()[lead])
    if first is None:
        return None
    leading = ", ".join(["0"] * (value.dim() - 2) + [":", ":"])
    heat = {"slice": f"[{leading}]", "shape": list(value.shape), **first}
    if value.dim() >= 3 and value.shape[-3] > 1:
        heat["along"] = value.dim() - 3
        heat["more"] = [_picture(value.detach()[lead[:-1] + (i,)])
                        for i in range(1, min(value.shape[-3], MAX_SLICES))]
    return heat


def acted_heatmap(value: Any, before: dict[str, Any]) -> dict[str, Any] | None:
    """The 2-D slice an intervention acted on, before and after it, on one scale: `before`
    is an intervention record's summary of the value before the action (its `slice`, the
    leading indices of the slice, and `plane`, the slice's cell means), `value` the pass's
    saved value after it. Returns {'slice', 'shape', 'before', 'after'} (pictures as
    `heatmap` makes them, sharing lo and hi), or None when `heatmap` would draw no picture
    of `value`, the summary has no slice, or no cell of either holds a finite mean.

    Example:
        >>> after = torch.zeros(2, 8, 8)
        >>> h = acted_heatmap(after, {"slice": [1], "plane": {"rows": 8, "cols": 8, "means": [1.0] * 64}})
        >>> h["slice"], h["before"]["lo"], h["after"]["hi"]
        ('[1, :, :]', 0.0, 1.0)
    """
    lead, plane = before.get("slice"), before.get("plane")
    if lead is None or plane is None or not isinstance(value, torch.Tensor) or value.dim() < 2 \
            or min(value.shape[-2:]) < MIN_SIDE or len(lead) != value.dim() - 2:
        return None
    after = _cells(value.detach()[tuple(lead)])
    if (plane["rows"], plane["cols"]) != tuple(after.shape):
        return None
    means = torch.tensor([math.nan if m is None else m for m in plane["means"]], dtype=torch.float64)
    pair = (means.reshape(after.shape), after)
    known = torch.cat([cells[torch.isfinite(cells)] for cells in pair])
    if not len(known):
        return None
    lo, hi = float(known.min()), float(known.max())
    return {"slice": f"[{', '.join([*map(str, lead), ':', ':'])}]", "shape": list(value.shape),
            "before": _encode(pair[0], lo, hi), "after": _encode(pair[1], lo, hi)}


def _picture(plane: torch.Tensor) -> dict[str, Any] | None:
    """One 2-D slice at most HEAT_SIDE cells a side, on its own scale (None: no finite value)."""
    cells = _cells(plane)
    known = cells[torch.isfinite(cells)]
    if not len(known):
        return None
    return _encode(cells, float(known.min()), float(known.max()))


def _cells(plane: torch.Tensor) -> torch.Tensor:
    """A slice's means over at most HEAT_SIDE cells a side (float64; NaN: a cell with no
    finite value)."""
    plane = plane.to("cpu")
    plane = (plane.abs() if plane.is_complex() else plane)
    finite = torch.isfinite(plane)
    if plane.dtype.is_floating_point:  # a mask's fills are not values (torchlog.statistics)
        info = torch.finfo(plane.dtype)
        finite &= (plane != info.min) & (plane != info.max)
    plane = plane.to(torch.float64)
    rows, cols = plane.shape
    size = (min(rows, HEAT_SIDE), min(cols, HEAT_SIDE))
    # Means over the finite values a cell covers: pooled sums over pooled counts.
    sums = F.adaptive_avg_pool2d(torch.where(finite, plane, 0.0)[None, None], size)[0, 0]
    shares = F.adaptive_avg_pool2d(finite.to(torch.float64)[None, None], size)[0, 0]
    return torch.where(shares > 0, sums / shares.clamp(min=1e-300), torch.nan)


def _encode(cells: torch.Tensor, lo: float, hi: float) -> dict[str, Any]:
    """Cells as the page draws them: one byte each from lo (0) to hi (255), and `holes`."""
    size = tuple(cells.shape)
    scaled = ((cells - lo) / (hi - lo) * 255) if hi > lo else torch.zeros_like(cells)
    data = scaled.nan_to_num(0.0).round().clamp(0, 255).to(torch.uint8)
    picture = {"rows": size[0], "cols": size[1], "lo": lo, "hi": hi,
               "cells": base64.b64encode(bytes(data.reshape(-1).tolist())).decode("ascii")}
    holes = ~torch.isfinite(cells)
    if bool(holes.any()):  # cells of NaN, Inf or a mask's fill only: drawn in a colour of their own
        picture["holes"] = base64.b64encode(bytes(holes.reshape(-1).to(torch.uint8).tolist())).decode("ascii")
    return picture


def heatmaps(values: dict[int, Any], budget: int) -> dict[int, dict[str, Any]]:
    """`heatmap` of each value (by key, in order) while their cells fit in `budget` bytes."""
    found: dict[int, dict[str, Any]] = {}
    for key, value in values.items():
        heat = heatmap(value)
        if heat is None:
            continue
        budget -= len(heat["cells"]) + sum(len(p["cells"]) for p in heat.get("more", ()) if p)
        if budget < 0:
            break
        found[key] = heat
    return found
