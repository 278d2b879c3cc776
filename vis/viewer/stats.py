"""Summary statistics and a histogram of a saved activation, small enough to put in a page."""
from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["NUM_BINS", "tensor_stats"]

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
    t = value.detach().reshape(-1)
    if t.is_complex():
        t = t.abs()
    # float64 stays float64; everything else is summarised in float32, which is exact for
    # the min, max and counts and close enough for a mean shown with 5 digits.
    t = t.to("cpu", torch.float64 if t.dtype == torch.float64 else torch.float32)
    numel = t.numel()
    finite_mask = torch.isfinite(t)
    all_finite = bool(finite_mask.all())
    num_nan = 0 if all_finite else int(torch.isnan(t).sum())
    finite = t if all_finite else t[finite_mask]
    stats: dict[str, Any] = {
        "numel": numel,
        "nan": num_nan,
        "inf": 0 if all_finite else numel - finite.numel() - num_nan,
        "zeros": _ratio(numel - int(torch.count_nonzero(t)), numel),
        "min": None, "max": None, "mean": None, "std": None, "hist": None,
    }
    if finite.numel():
        lo, hi = (float(v) for v in torch.aminmax(finite))
        values = finite.double() if finite.numel() < 4096 else finite
        if values.numel() > 1:
            std, mean = (float(v) for v in torch.std_mean(values))
        else:
            std, mean = 0.0, float(values[0])
        stats.update(min=lo, max=hi, mean=_short(mean), std=_short(std),
                     hist=_histogram(finite, lo, hi))
    return stats


def _short(value: float) -> float:
    """Seven significant digits: all the page shows, and a third of the JSON."""
    return float(f"{value:.7g}")


def _ratio(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def _histogram(finite: torch.Tensor, lo: float, hi: float) -> dict[str, Any]:
    """Counts in NUM_BINS equal bins over [lo, hi]; one bin when every value is equal."""
    if hi == lo or not math.isfinite(hi - lo):
        return {"lo": lo, "hi": hi, "counts": [finite.numel()]}
    counts = torch.histc(finite, bins=NUM_BINS, min=lo, max=hi)
    return {"lo": lo, "hi": hi, "counts": [int(c) for c in counts.tolist()]}
