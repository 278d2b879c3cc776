"""Summary statistics of saved tensors: the one definition the viewer and every exporter use.

`summarize_all` takes many tensors at once and computes each statistic for all of them with a
handful of segmented torch reductions, so 20,000 small activations cost about as much as one
large one; `summarize` is the same code for one tensor. Every statistic except the NaN, Inf
and zero counts is over the finite entries, in float64; the std is the population std
(divided by the number of finite entries, as numpy's and TensorBoard's), not the unbiased one.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["NUM_BINS", "TensorStats", "summarize", "summarize_all"]

NUM_BINS = 24
# Tensors are summarised in groups of about this many elements (a float64 copy each): small
# ones share a group, a larger one is a group of its own.
GROUP_ELEMENTS = 1 << 22


@dataclass(frozen=True, slots=True)
class TensorStats:
    """What a front end shows of one tensor; the float fields are None without a finite entry."""

    numel: int  # every entry, NaN and Inf included
    num_nan: int
    num_inf: int  # +Inf and -Inf
    zeros: float  # share of entries equal to 0 (0.0 for an empty tensor)
    min: float | None
    max: float | None
    mean: float | None
    std: float | None  # population std: sqrt(mean((x - mean)**2)); 0.0 for one entry
    counts: tuple[int, ...]  # NUM_BINS equal bins over [min, max]; one bin when min == max

    @property
    def num_finite(self) -> int:
        return self.numel - self.num_nan - self.num_inf

    def bin_edges(self) -> list[float]:
        """The len(counts) + 1 edges of the histogram's bins, from min to max."""
        if not self.counts:
            return []
        lo, hi, n = self.min, self.max, len(self.counts)
        return [lo + (hi - lo) * (i / n) if i < n else hi for i in range(n + 1)]


def summarize(value: torch.Tensor) -> TensorStats:
    """The statistics of one tensor (the same computation as `summarize_all`).

    Raises:
        TypeError: `value` is not a torch.Tensor.

    Example:
        >>> s = summarize(torch.tensor([0.0, 1.0, 3.0, float("nan"), float("inf")]))
        >>> s.min, s.max, s.mean, s.num_nan, s.num_inf, s.zeros
        (0.0, 3.0, 1.3333333333333333, 1, 1, 0.2)
        >>> round(s.std, 6), sum(s.counts), len(s.counts)
        (1.247219, 3, 24)
    """
    return summarize_all([value])[0]


def summarize_all(values: Iterable[torch.Tensor]) -> list[TensorStats]:
    """The statistics of each tensor of `values`, in order.

    Complex tensors are summarised by magnitude, bool and integer ones as numbers; any
    device and dtype is read (copied to the CPU in float64).

    Raises:
        TypeError: an item is not a torch.Tensor; names its position and type.

    Example:
        >>> [s.max for s in summarize_all([torch.ones(3), torch.arange(5), torch.tensor([True])])]
        [1.0, 4.0, 1.0]
    """
    flat = [_flat(v, i) for i, v in enumerate(values)]
    found: list[TensorStats | None] = [None] * len(flat)
    for group in _groups(flat):
        for index, stats in zip(group, _summarize_group([flat[i] for i in group])):
            found[index] = stats
    return found  # type: ignore[return-value]  # every index is in one group


def _flat(value: Any, position: int) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"summarize_all takes torch.Tensors; item {position} is a "
                        f"{type(value).__name__}: {value!r:.80}")
    t = value.detach().reshape(-1)
    if t.is_complex():
        t = t.abs()
    return t.to("cpu")


def _groups(flat: Sequence[torch.Tensor]) -> list[list[int]]:
    """Positions of `flat` in groups of at most GROUP_ELEMENTS elements (or one tensor)."""
    groups: list[list[int]] = []
    size = 0
    for i, t in enumerate(flat):
        if not groups or size + t.numel() > GROUP_ELEMENTS:
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += t.numel()
    return groups


def _concat(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """One float64 tensor of `parts` end to end; same-dtype parts are joined before converting."""
    if all(p.dtype == parts[0].dtype for p in parts):
        return torch.cat(list(parts)).to(torch.float64)
    return torch.cat([p.to(torch.float64) for p in parts])


def _summarize_group(parts: Sequence[torch.Tensor]) -> list[TensorStats]:
    """Every statistic of every part, each as one segmented reduction over all of them."""
    n = len(parts)
    sizes = torch.tensor([p.numel() for p in parts], dtype=torch.int64)
    x = _concat(parts)
    seg = torch.repeat_interleave(torch.arange(n), sizes)
    finite_mask = torch.isfinite(x)
    num_nan = torch.bincount(seg[torch.isnan(x)], minlength=n)
    num_zero = torch.bincount(seg[x == 0], minlength=n)
    if not bool(finite_mask.all()):
        x, seg = x[finite_mask], seg[finite_mask]
    num_finite = torch.bincount(seg, minlength=n)
    lo = torch.zeros(n, dtype=torch.float64).scatter_reduce(0, seg, x, "amin", include_self=False)
    hi = torch.zeros(n, dtype=torch.float64).scatter_reduce(0, seg, x, "amax", include_self=False)
    # Sums of x / scale, scale a power of two (exact) at least half of max |x|: no overflow
    # near 1e308 (2**1024 itself is not a float64).
    _, exponent = torch.frexp(torch.maximum(lo.abs(), hi.abs()))
    scale = torch.ldexp(torch.ones(n, dtype=torch.float64), exponent - 1)
    scaled = x / scale[seg]
    count = num_finite.clamp(min=1).to(torch.float64)
    mean_scaled = torch.bincount(seg, weights=scaled, minlength=n) / count
    deviation = scaled - mean_scaled[seg]
    std = torch.sqrt(torch.bincount(seg, weights=deviation * deviation, minlength=n) / count) * scale
    columns = zip(sizes.tolist(), num_nan.tolist(), num_finite.tolist(), num_zero.tolist(),
                  lo.tolist(), hi.tolist(), (mean_scaled * scale).tolist(), std.tolist(),
                  _histograms(x, seg, lo, hi, n).tolist())
    return [_stats(*column) for column in columns]

def _histograms(x: torch.Tensor, seg: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
                n: int) -> torch.Tensor:
    """(n, NUM_BINS) counts of equal bins over each part's [lo, hi]; the top edge in the last bin.

    Halves keep hi - lo finite for values near the float64 limits.
    """
    half_width = hi / 2 - lo / 2
    span = torch.where(half_width > 0, half_width, torch.ones_like(half_width))
    position = (x / 2 - (lo / 2)[seg]) / span[seg]
    bins = (position * NUM_BINS).floor().clamp_(0, NUM_BINS - 1).to(torch.int64)
    return torch.bincount(seg * NUM_BINS + bins, minlength=n * NUM_BINS).reshape(n, NUM_BINS)


def _stats(numel: int, nan: int, finite: int, zero: int, low: float, high: float, mean: float,
           std: float, counts: list[int]) -> TensorStats:
    """One part's statistics from its entry in each reduction."""
    common = {"numel": numel, "num_nan": nan, "num_inf": numel - nan - finite,
              "zeros": zero / numel if numel else 0.0}
    if not finite:
        return TensorStats(**common, min=None, max=None, mean=None, std=None, counts=())
    return TensorStats(**common, min=low, max=high,
                       mean=min(max(mean, low), high),  # rounding can put it a hair outside
                       std=std, counts=tuple(counts) if high > low else (finite,))
