"""Statistics of saved activations as the page holds them (computed by `torchlog.statistics`)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchlog.statistics import NUM_BINS, TensorStats, summarize_all

__all__ = ["NUM_BINS", "page_stats", "tensor_stats", "tensor_stats_all"]


def tensor_stats(value: Any) -> dict[str, Any] | None:
    """Min, max, mean, std, share of zeros, NaN and Inf counts and a histogram of `value`.

    Statistics are over the finite entries (`torchlog.statistics`: the std is the population
    std); NaN, Inf and a mask's fills (the dtype's finfo.min or finfo.max, `masked`, present
    only when there are some) are counted apart, so a tensor that holds them still gets a
    histogram of the rest. Returns None for anything that is not a tensor (a postfunc result, say).

    Example:
        >>> s = tensor_stats(torch.tensor([0.0, 1.0, float("nan"), float("inf")]))
        >>> s["min"], s["max"], s["std"], s["nan"], s["inf"], s["zeros"]
        (0.0, 1.0, 0.5, 1, 1, 0.25)
    """
    return tensor_stats_all([value])[0]


def tensor_stats_all(values: Sequence[Any]) -> list[dict[str, Any] | None]:
    """`tensor_stats` of each value, the tensors summarised together (much faster for many)."""
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    found = iter(summarize_all(tensors))
    return [page_stats(next(found)) if isinstance(v, torch.Tensor) else None for v in values]


def page_stats(stats: TensorStats) -> dict[str, Any]:
    """The page's JSON form: short keys, mean and std to the seven digits the panel shows."""
    entry: dict[str, Any] = {
        "numel": stats.numel, "nan": stats.num_nan, "inf": stats.num_inf, "zeros": stats.zeros,
        "min": stats.min, "max": stats.max, "mean": _short(stats.mean), "std": _short(stats.std),
        "hist": None,
    }
    if stats.num_masked:  # a mask's fills, outside every other figure (left out when none)
        entry["masked"] = stats.num_masked
    if stats.counts:
        entry["hist"] = list(stats.counts)  # its bins span [min, max]: not repeated (a 20,000-op page: 1 MB)
    return entry


def _short(value: float | None) -> float | None:
    """Seven significant digits: all the page shows, and a third of the JSON."""
    return None if value is None else float(f"{value:.7g}")
