"""A 2-D picture of a saved value for the panel: an attention map, an image channel, a
(sequence, features) activation, at most HEAT_SIDE cells a side, one byte a cell."""
from __future__ import annotations

import base64
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["HEAT_SIDE", "MIN_SIDE", "heatmap", "heatmaps"]

HEAT_SIDE = 32  # cells a side at most; larger slices are averaged down
MIN_SIDE = 8  # both of the last two dimensions at least this, or no picture


def heatmap(value: Any) -> dict[str, Any] | None:
    """The first 2-D slice of `value` (index 0 on every leading dimension) as a heatmap.

    Returns None when `value` is not a tensor of two or more dimensions whose last two are at
    least MIN_SIDE, or when the slice holds no finite value. `cells` is base64 of rows x cols
    bytes, row by row: 0 is `lo`, 255 is `hi`, linearly; a cell averages the values it
    covers (NaN and Inf left out; a cell with none is 0). `slice` says which slice of the
    value's `shape` it is.

    Example:
        >>> h = heatmap(torch.arange(100.0).reshape(1, 10, 10))
        >>> h["slice"], h["shape"], h["rows"], h["cols"], h["lo"], h["hi"]
        ('[0, :, :]', [1, 10, 10], 10, 10, 0.0, 99.0)
    """
    if not isinstance(value, torch.Tensor) or value.dim() < 2:
        return None
    rows, cols = value.shape[-2:]
    if rows < MIN_SIDE or cols < MIN_SIDE:
        return None
    plane = value.detach()[(0,) * (value.dim() - 2)].to("cpu")
    plane = (plane.abs() if plane.is_complex() else plane).to(torch.float64)
    finite = torch.isfinite(plane)
    if not bool(finite.any()):
        return None
    size = (min(rows, HEAT_SIDE), min(cols, HEAT_SIDE))
    # Means over the finite values a cell covers: pooled sums over pooled counts.
    sums = F.adaptive_avg_pool2d(torch.where(finite, plane, 0.0)[None, None], size)[0, 0]
    shares = F.adaptive_avg_pool2d(finite.to(torch.float64)[None, None], size)[0, 0]
    cells = torch.where(shares > 0, sums / shares.clamp(min=1e-300), torch.nan)
    known = cells[torch.isfinite(cells)]
    lo, hi = float(known.min()), float(known.max())
    scaled = ((cells - lo) / (hi - lo) * 255) if hi > lo else torch.zeros_like(cells)
    data = scaled.nan_to_num(0.0).round().clamp(0, 255).to(torch.uint8)
    leading = ", ".join(["0"] * (value.dim() - 2) + [":", ":"])
    return {"slice": f"[{leading}]", "shape": list(value.shape), "rows": size[0], "cols": size[1],
            "lo": lo, "hi": hi, "cells": base64.b64encode(bytes(data.reshape(-1).tolist())).decode("ascii")}


def heatmaps(values: dict[int, Any], budget: int) -> dict[int, dict[str, Any]]:
    """`heatmap` of each value (by key, in order) while their cells fit in `budget` bytes."""
    found: dict[int, dict[str, Any]] = {}
    for key, value in values.items():
        heat = heatmap(value)
        if heat is None:
            continue
        budget -= len(heat["cells"])
        if budget < 0:
            break
        found[key] = heat
    return found
