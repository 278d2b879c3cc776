"""Summary statistics and a histogram of a saved activation, small enough to put in a page."""
from __future__ import annotations

import math
from typing import Any

import torch

NUM_BINS = 24


def tensor_stats(value: Any) -> dict[str, Any] | None:
    """Min, max, mean, std, share of zeros, NaN and Inf counts and a histogram of `value`.

    Statistics are over the finite entries; NaN and Inf are counted apart, so a tensor
    that holds them still gets a histogram of the rest. Bool and integer tensors are
    read as numbers; complex tensors by magnitude. Returns None for anything that is
    not a tensor (a postfunc result, say).

    Example:
        >>> s = tensor_stats(torch.tensor([0.0, 1.0, float("nan"), float("inf")]))
        >>> s["min"], s["max"], s["nan"], s["inf"], s["zeros"]
        (0.0, 1.0, 1, 1, 0.25)
    """
    if not isinstance(value, torch.Tensor):
        return None
    t = value.detach()
    if t.is_complex():
        t = t.abs()
    t = t.to("cpu", torch.float64).reshape(-1)
    numel = t.numel()
    finite_mask = torch.isfinite(t)
    finite = t[finite_mask]
    stats: dict[str, Any] = {
        "numel": numel,
        "nan": int(torch.isnan(t).sum()),
        "inf": int((~finite_mask).sum()) - int(torch.isnan(t).sum()),
        "zeros": _ratio(int((t == 0).sum()), numel),
        "min": None, "max": None, "mean": None, "std": None, "hist": None,
    }
    if finite.numel():
        lo, hi = float(finite.min()), float(finite.max())
        stats.update(min=lo, max=hi, mean=float(finite.mean()),
                     std=float(finite.std()) if finite.numel() > 1 else 0.0,
                     hist=_histogram(finite, lo, hi))
    return stats


def _ratio(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def _histogram(finite: torch.Tensor, lo: float, hi: float) -> dict[str, Any]:
    """Counts in NUM_BINS equal bins over [lo, hi]; one bin when every value is equal."""
    if hi == lo or not math.isfinite(hi - lo):
        return {"lo": lo, "hi": hi, "counts": [finite.numel()]}
    counts = torch.histc(finite, bins=NUM_BINS, min=lo, max=hi)
    return {"lo": lo, "hi": hi, "counts": [int(c) for c in counts.tolist()]}
