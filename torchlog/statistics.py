"""Summary statistics of saved tensors: the one definition the viewer and every exporter use.

`summarize_all` takes many tensors at once: small ones are laid end to end and each statistic
is one segmented reduction over all of them, so 20,000 small activations cost about as much
as a few large ones; `summarize` is the same code for one tensor. Every statistic except the
NaN, Inf and zero counts is over the finite entries, in float64; the std is the population
std (divided by the number of finite entries, as numpy's and TensorBoard's), not the unbiased
one; the histogram is `torch.histogram`'s, NUM_BINS equal bins from the min to the max.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["NUM_BINS", "TensorStats", "summarize", "summarize_all"]

NUM_BINS = 24
# Tensors under SMALL elements are summarised in groups of about GROUP_ELEMENTS (a float64
# copy each); a larger one alone, with plain reductions.
GROUP_ELEMENTS = 1 << 22
SMALL = 1 << 12


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
    counts: tuple[int, ...]  # torch.histogram's NUM_BINS bins over [min, max]; one when min == max

    @property
    def num_finite(self) -> int:
        return self.numel - self.num_nan - self.num_inf

    def bin_edges(self) -> list[float]:
        """The len(counts) + 1 edges of the histogram's bins, from min to max."""
        if not self.counts:
            return []
        if len(self.counts) == 1:
            return [self.min, self.max]
        return torch.linspace(self.min, self.max, NUM_BINS + 1, dtype=torch.float64).tolist()


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
    """One float64 tensor of `parts` end to end; same-dtype parts are joined before converting."""
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


def _summarize_group(parts: Sequence[torch.Tensor]) -> list[TensorStats]:
    """Every statistic of every part, each as one reduction over all of them."""
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
    num_finite = segments.sizes(x)
    # Where |x| is near the float64 limits, x / scale with scale a power of two (exact): no
    # overflow near 1e308 (2**1024 itself is not a float64), no underflow of the squares of
    # subnormals. Elsewhere the scale is 1 and costs nothing.
    _, exponent = torch.frexp(torch.maximum(lo.abs(), hi.abs()))
    exponent = torch.where((exponent > 500) | (exponent < -500), exponent - 1, torch.zeros_like(exponent))
    scale = torch.ldexp(torch.ones(segments.n, dtype=torch.float64), exponent)
    scaled = x / segments.spread(scale) if bool((exponent != 0).any()) else x
    mean, variance = segments.mean_variance(scaled, num_finite.clamp(min=1).to(torch.float64))
    finite_counts = num_finite.tolist()
    counts = _histograms(scaled, finite_counts, (lo / scale).tolist(), (hi / scale).tolist())
    columns = zip(sizes, num_nan.tolist(), finite_counts, num_zero.tolist(), lo.tolist(),
                  hi.tolist(), (mean * scale).tolist(), (variance.sqrt() * scale).tolist(), counts)
    return [_stats(*column) for column in columns]


def _histograms(x: torch.Tensor, sizes: list[int], lo: list[float], hi: list[float]) -> list[list[int]]:
    """Each part's counts in NUM_BINS equal bins over its [lo, hi]: `torch.histogram`'s bins
    (edges from `torch.linspace`; each bin holds its lower edge, the last its upper one
    too); one bin when lo == hi, none without values."""
    found, start = [], 0
    for size, low, high in zip(sizes, lo, hi):
        part = x[start:start + size]
        start += size
        if not size or high <= low:
            found.append([size] if size else [])
            continue
        found.append(torch.histogram(part, bins=NUM_BINS, range=(low, high)).hist.long().tolist())
    return found


def _stats(numel: int, nan: int, finite: int, zero: int, low: float, high: float, mean: float,
           std: float, counts: list[int]) -> TensorStats:
    """One part's statistics from its entry in each reduction."""
    common = {"numel": numel, "num_nan": nan, "num_inf": numel - nan - finite,
              "zeros": zero / numel if numel else 0.0}
    if not finite:
        return TensorStats(**common, min=None, max=None, mean=None, std=None, counts=())
    return TensorStats(**common, min=low, max=high,
                       mean=min(max(mean, low), high),  # rounding can put it a hair outside
                       std=std, counts=tuple(counts))
