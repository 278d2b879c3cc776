"""Summary statistics of saved tensors: the one definition the viewer and every exporter use.

`summarize_all` takes many tensors at once: small ones are laid end to end and each statistic
is one segmented reduction over all of them, so 20,000 small activations cost about as much
as a few large ones; `summarize` is the same code for one tensor. Sentinels are counted apart
and kept out of every other statistic: NaN, +-Inf, and entries equal to the tensor's dtype's
`finfo.min` or `finfo.max`, the values additive attention masks fill in (transformers'
`torch.finfo(dtype).min`), `num_masked`. Every statistic except these counts and the zero
count is over the remaining entries, in float64 (scaled by a power of two near its limits,
so nothing overflows); the std is the population
std (divided by the number of entries it covers, as numpy's and TensorBoard's), not the
unbiased one; the histogram is numpy's: NUM_BINS equal bins from the min to the max, edge k at
min + k * (max - min) / NUM_BINS, each bin holding its lower edge and the last its upper
one too, computed the same way on every machine (torch.linspace's edges depend on the
CPU's vector width).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from torchlog.collector import collector_paused

__all__ = ["NUM_BINS", "TensorStats", "summarize", "summarize_all"]

NUM_BINS = 24
# Tensors under SMALL elements are summarised in groups of about GROUP_ELEMENTS (a float64
# copy each); a larger one alone, with plain reductions.
GROUP_ELEMENTS = 1 << 22
SMALL = 1 << 12
BLOCK = 1 << 16  # elements per block of the histogram's arithmetic
EDGE_SLACK = 1e-9  # of a bin: positions this close to an edge are checked against it


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
    counts: tuple[int, ...]  # NUM_BINS equal bins over [min, max] (numpy's); one when min == max; empty when not asked for
    num_masked: int = 0  # entries equal to the dtype's finfo.min or finfo.max (a mask's fill)

    @property
    def num_finite(self) -> int:
        """Entries the statistics cover: neither NaN, Inf nor a mask's fill."""
        return self.numel - self.num_nan - self.num_inf - self.num_masked

    def bin_edges(self) -> list[float]:
        """The len(counts) + 1 edges of the histogram's bins: min + k * (max - min) / bins, and max."""
        if not self.counts:
            return []
        lo, hi, n = self.min, self.max, len(self.counts)
        return [lo + k * ((hi - lo) / n) for k in range(n)] + [hi]


def summarize(value: torch.Tensor) -> TensorStats:
    """The statistics of one tensor (the same computation as `summarize_all`).

    Raises:
        TypeError: `value` is not a torch.Tensor.

    Example:
        >>> s = summarize(torch.tensor([0.0, 1.0, 3.0, float("nan"), float("inf")]))
        >>> s.min, s.max, round(s.mean, 9), s.num_nan, s.num_inf, s.zeros
        (0.0, 3.0, 1.333333333, 1, 1, 0.2)
        >>> round(s.std, 6), sum(s.counts), len(s.counts)
        (1.247219, 3, 24)
    """
    return summarize_all([value])[0]


def summarize_all(values: Iterable[torch.Tensor], histograms: bool = True) -> list[TensorStats]:
    """The statistics of each tensor of `values`, in order.

    Complex tensors are summarised by magnitude, bool and integer ones as numbers; any
    device and dtype is read (copied to the CPU in float64). With `histograms=False`
    every `counts` is empty: the histogram is about half the work.

    Raises:
        TypeError: an item is not a torch.Tensor; names its position and type.

    Example:
        >>> [s.max for s in summarize_all([torch.ones(3), torch.arange(5), torch.tensor([True])])]
        [1.0, 4.0, 1.0]
    """
    with collector_paused():  # many small acyclic objects: no sweeps meanwhile
        flat = [_flat(v, i) for i, v in enumerate(values)]
        found: list[TensorStats | None] = [None] * len(flat)
        for group in _groups(flat):
            for index, stats in zip(group, _summarize_group([flat[i] for i in group], histograms)):
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
    """Positions of `flat` in groups: small tensors together, up to GROUP_ELEMENTS elements;
    a tensor of SMALL elements or more alone (its reductions then need no segment ids)."""
    groups: list[list[int]] = []
    current: list[int] | None = None
    size = 0
    for i, t in enumerate(flat):
        if t.numel() >= SMALL:
            groups.append([i])
            continue
        if current is None or size + t.numel() > GROUP_ELEMENTS:
            current, size = [], 0
            groups.append(current)
        current.append(i)
        size += t.numel()
    return groups


def _concat(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """One float64 tensor of `parts` end to end; same-dtype parts are joined before converting,
    and a single part is converted without a copy of its own (the values are only read)."""
    if len(parts) == 1:
        return parts[0].to(torch.float64)
    if all(p.dtype == parts[0].dtype for p in parts):
        return torch.cat(list(parts)).to(torch.float64)
    return torch.cat([p.to(torch.float64) for p in parts])


class _Segments:
    """Reductions per part of tensors laid end to end: by segment id per element, or, for a
    single part, plain torch reductions (each result a 1-element tensor either way)."""

    def __init__(self, sizes: list[int]) -> None:
        self.n = len(sizes)
        self.ids = None if self.n == 1 else torch.repeat_interleave(
            torch.arange(self.n), torch.tensor(sizes, dtype=torch.int64))

    def keep(self, mask: torch.Tensor) -> None:
        if self.ids is not None:
            self.ids = self.ids[mask]

    def spread(self, per_part: torch.Tensor) -> torch.Tensor:
        """Each element's part's value (for one part, that value: broadcast, not copied)."""
        return per_part[0] if self.ids is None else per_part[self.ids]

    def count(self, mask: torch.Tensor) -> torch.Tensor:
        if self.ids is None:
            return torch.count_nonzero(mask).reshape(1)
        return torch.bincount(self.ids[mask], minlength=self.n)

    def sizes(self, values: torch.Tensor) -> torch.Tensor:
        if self.ids is None:
            return torch.tensor([values.numel()])
        return torch.bincount(self.ids, minlength=self.n)

    def zeros(self, values: torch.Tensor) -> torch.Tensor:
        if self.ids is None:  # NaN is not zero, as numpy counts
            return (values.numel() - torch.count_nonzero(values)).reshape(1)
        return self.count(values == 0)

    def extremes(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(min, max) per part, NaN where a part holds one; 0 for a part without values."""
        if self.ids is None:
            if not values.numel():
                return torch.zeros(1, dtype=values.dtype), torch.zeros(1, dtype=values.dtype)
            lo, hi = torch.aminmax(values)
            return lo.reshape(1), hi.reshape(1)
        empty = torch.zeros(self.n, dtype=values.dtype)
        return (empty.scatter_reduce(0, self.ids, values, "amin", include_self=False),
                empty.scatter_reduce(0, self.ids, values, "amax", include_self=False))

    def mean_variance(self, values: torch.Tensor, count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and population variance per part (`count` values each, at least 1)."""
        if self.ids is None:
            if not values.numel():
                return torch.zeros(1, dtype=values.dtype), torch.zeros(1, dtype=values.dtype)
            variance, mean = torch.var_mean(values, correction=0)
            return mean.reshape(1), variance.reshape(1)
        mean = torch.bincount(self.ids, weights=values, minlength=self.n) / count
        deviation = values - self.spread(mean)
        return mean, torch.bincount(self.ids, weights=deviation.square_(), minlength=self.n) / count

    def histograms(self, values: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        """(parts, NUM_BINS) counts in numpy's bins: NUM_BINS equal bins over each part's
        [lo, hi], edge k at lo + k * (hi - lo) / NUM_BINS and the last at hi, each bin holding
        its lower edge, the last its upper one too. In blocks that stay in cache."""
        step = (hi - lo) / NUM_BINS
        per_bin = 1 / torch.where(step > 0, step, torch.ones_like(step))
        counts = torch.zeros(self.n * NUM_BINS, dtype=torch.int64)
        for start in range(0, values.numel(), BLOCK):
            block = values[start:start + BLOCK]
            ids = None if self.ids is None else self.ids[start:start + BLOCK]
            low, width, scale = ((lo[0], step[0], per_bin[0]) if ids is None
                                 else (lo[ids], step[ids], per_bin[ids]))
            position = (block - low).mul_(scale)
            index = position.floor()
            # Rounding can put a value right at an inner edge one bin off: those few (if any)
            # are placed by the edges themselves. The outer edges are the min and the max.
            fraction = position.sub_(index)
            near = ((fraction < EDGE_SLACK) & (index >= 1) & (index <= NUM_BINS - 1)) | \
                ((fraction > 1 - EDGE_SLACK) & (index <= NUM_BINS - 2))
            index.clamp_(0, NUM_BINS - 1)
            if bool(near.any()):
                _place_by_edges(block, index, near, low, width)
            index = index.to(torch.int64)
            counts += torch.bincount(index if ids is None else ids * NUM_BINS + index,
                                     minlength=self.n * NUM_BINS)
        return counts.reshape(self.n, NUM_BINS)


def _place_by_edges(block: torch.Tensor, index: torch.Tensor, near: torch.Tensor,
                    low: torch.Tensor, width: torch.Tensor) -> None:
    """Move the `near` entries of `index` to the bin their value lies in by the edges."""
    x, k = block[near], index[near]
    low = low[near] if low.dim() else low
    width = width[near] if width.dim() else width
    k -= (x < low + k * width).to(k.dtype)
    k += ((x >= low + (k + 1) * width) & (k < NUM_BINS - 1)).to(k.dtype)
    index[near] = k


def _summarize_group(parts: Sequence[torch.Tensor], histograms: bool) -> list[TensorStats]:
    """Every statistic of every part, each as one reduction over all of them (the
    histograms only when asked)."""
    sizes = [p.numel() for p in parts]
    x = _concat(parts)
    segments = _Segments(sizes)
    num_zero = segments.zeros(x)
    lo, hi = segments.extremes(x)
    num_nan = torch.zeros(segments.n, dtype=torch.int64)
    if not bool(torch.isfinite(lo).all() and torch.isfinite(hi).all()):  # NaN or Inf somewhere
        finite = torch.isfinite(x)
        num_nan = segments.count(torch.isnan(x))
        x = x[finite]
        segments.keep(finite)
        lo, hi = segments.extremes(x)
    x, lo, hi, num_masked = _drop_mask_fills(parts, x, segments, lo, hi)
    num_finite = segments.sizes(x)
    # Where |x| is near the float64 limits, x / scale with scale a power of two (exact): no
    # overflow near 1e308 (2**1024 itself is not a float64), no underflow of the squares of
    # subnormals. Elsewhere the scale is 1 and costs nothing.
    _, exponent = torch.frexp(torch.maximum(lo.abs(), hi.abs()))
    exponent = torch.where((exponent > 500) | (exponent < -500), exponent - 1, torch.zeros_like(exponent))
    scale = torch.ldexp(torch.ones(segments.n, dtype=torch.float64), exponent)
    scaled = x / segments.spread(scale) if bool((exponent != 0).any()) else x
    mean, variance = segments.mean_variance(scaled, num_finite.clamp(min=1).to(torch.float64))
    counts = segments.histograms(scaled, lo / scale, hi / scale).tolist() if histograms else [None] * segments.n
    columns = zip(sizes, num_nan.tolist(), num_masked.tolist(), num_finite.tolist(), num_zero.tolist(),
                  lo.tolist(), hi.tolist(), (mean * scale).tolist(), (variance.sqrt() * scale).tolist(), counts)
    return [_stats(*column) for column in columns]


def _fills(parts: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each part's mask fills (its dtype's finfo.min and finfo.max; -Inf and +Inf, which are
    already gone, for integers and booleans), in float64."""
    low, high = [], []
    for part in parts:
        info = torch.finfo(part.dtype) if part.dtype.is_floating_point else None
        low.append(info.min if info else -float("inf"))
        high.append(info.max if info else float("inf"))
    return torch.tensor(low, dtype=torch.float64), torch.tensor(high, dtype=torch.float64)


def _drop_mask_fills(parts: Sequence[torch.Tensor], x: torch.Tensor, segments: _Segments,
                     lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`x` without the entries equal to their part's mask fills, the new extremes and the
    count per part; where no part's extreme is a fill (nearly always), `x` as it is."""
    fill_lo, fill_hi = _fills(parts)
    num_masked = torch.zeros(segments.n, dtype=torch.int64)
    if not bool(((lo == fill_lo) | (hi == fill_hi)).any()):
        return x, lo, hi, num_masked
    masked = (x == segments.spread(fill_lo)) | (x == segments.spread(fill_hi))
    num_masked = segments.count(masked)
    kept = ~masked
    x = x[kept]
    segments.keep(kept)
    lo, hi = segments.extremes(x)
    return x, lo, hi, num_masked


def _stats(numel: int, nan: int, masked: int, finite: int, zero: int, low: float, high: float,
           mean: float, std: float, counts: list[int] | None) -> TensorStats:
    """One part's statistics from its entry in each reduction (`counts` None: no histogram)."""
    common = {"numel": numel, "num_nan": nan, "num_inf": numel - nan - masked - finite,
              "num_masked": masked, "zeros": zero / numel if numel else 0.0}
    if not finite:
        return TensorStats(**common, min=None, max=None, mean=None, std=None, counts=())
    return TensorStats(**common, min=low, max=high,
                       mean=min(max(mean, low), high),  # rounding can put it a hair outside
                       std=std, counts=() if counts is None else tuple(counts) if high > low else (finite,))
