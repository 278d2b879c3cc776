"""Histograms with bins learned from the data: per feature, equal bins on a grid of powers of two, widened as needed.

Each feature's bins have a width 2**e and edges at integer multiples of it, so two grids
of any widths nest: a bin of width 2**e lies inside one bin of every wider grid, and
counts move to a wider grid exactly. A feature's width is the smallest power of two for
which `num_bins` bins on that grid, starting at the bin of the smallest finite value seen,
reach the largest one (and no finer than 2**-50 of the largest magnitude, so bin numbers
stay exact integers in float64). That width depends only on the smallest and largest
values seen, so whatever the batches' order, sizes or sharding the final bins and counts
are those of one histogram of every value over those edges: merging is exact. Every
finite value falls in a bin (the last edge is above the largest value); -inf and +inf
are counted in `below` and `above`, NaN in neither.
"""
from __future__ import annotations

import torch

__all__ = ["LearnedHistogramCounts"]

_FINEST = 50  # bins no narrower than 2**-50 of a feature's largest magnitude
_LOWEST_EXPONENT = -1000  # 2**-1000 is still a normal float64: x * 2**-e stays exact
_I64 = torch.int64


class LearnedHistogramCounts:
    """Per feature: `counts` (features, bins) on the grid of width 2**`exponent` starting at
    bin number `start`, the smallest and largest finite values `low`, `high`, and counts
    of -inf (`below`) and +inf (`above`).

    Example:
        >>> h = LearnedHistogramCounts(4, 1)
        >>> h.add(torch.tensor([[0.1], [0.3], [0.9]], dtype=torch.float64))
        >>> h.edges().tolist(), h.counts.tolist()
        ([[0.0, 0.25, 0.5, 0.75, 1.0]], [[1, 1, 0, 1]])
    """

    def __init__(self, num_bins: int, num_features: int) -> None:
        self.num_bins = num_bins
        self.counts = torch.zeros(num_features, num_bins, dtype=_I64)
        self.exponent = torch.full((num_features,), _LOWEST_EXPONENT, dtype=_I64)
        self.start = torch.zeros(num_features, dtype=_I64)
        self.low = torch.full((num_features,), float("inf"), dtype=torch.float64)
        self.high = torch.full((num_features,), float("-inf"), dtype=torch.float64)
        self.below = torch.zeros(num_features, dtype=_I64)
        self.above = torch.zeros(num_features, dtype=_I64)

    def add(self, rows: torch.Tensor) -> None:
        """Count a float64 matrix of samples (rows) by features (columns)."""
        batch = LearnedHistogramCounts(self.num_bins, rows.shape[1])
        finite = rows.isfinite()
        batch.below = (rows == float("-inf")).sum(dim=0)
        batch.above = (rows == float("inf")).sum(dim=0)
        batch.low = torch.where(finite, rows, float("inf")).amin(dim=0) if len(rows) else batch.low
        batch.high = torch.where(finite, rows, float("-inf")).amax(dim=0) if len(rows) else batch.high
        batch.exponent = _exponent(batch.low, batch.high, self.num_bins, batch.exponent)
        batch.start = _bin_numbers(batch.low, batch.exponent)
        local = (_bin_numbers(rows, batch.exponent) - batch.start).clamp_(0, self.num_bins - 1)
        feature = torch.arange(rows.shape[1]).expand_as(local)
        flat = (feature * self.num_bins + local)[finite]
        batch.counts = torch.bincount(flat, minlength=batch.counts.numel()).view_as(batch.counts)
        self.merge(batch)

    def merge(self, other: LearnedHistogramCounts) -> None:
        """Fold `other` (the same bins and features) into this one: both move to the wider
        grid that holds every value either saw."""
        low, high = torch.minimum(self.low, other.low), torch.maximum(self.high, other.high)
        exponent = _exponent(low, high, self.num_bins, torch.maximum(self.exponent, other.exponent))
        start = _bin_numbers(low, exponent)
        counts = self._moved(exponent, start) + other._moved(exponent, start)
        self.counts, self.exponent, self.start, self.low, self.high = counts, exponent, start, low, high
        self.below = self.below + other.below
        self.above = self.above + other.above

    def edges(self) -> torch.Tensor:
        """(features, bins + 1) float64: bin k of a feature spans [edge k, edge k + 1); NaN
        for a feature that had no finite value."""
        numbers = self.start[:, None] + torch.arange(self.num_bins + 1)
        edges = torch.ldexp(numbers.double(), self.exponent[:, None].double())
        return torch.where(self.low.isfinite()[:, None], edges, float("nan"))

    def _moved(self, exponent: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """These counts on the grids of width 2**exponent starting at bin `start`."""
        shift = (exponent - self.exponent).clamp_(0, 62)[:, None]
        numbers = self.start[:, None] + torch.arange(self.num_bins)
        moved = torch.div(numbers, torch.ones_like(shift) << shift, rounding_mode="floor") - start[:, None]
        # Only empty bins (past a feature's largest value) can land outside the new window.
        return torch.zeros_like(self.counts).scatter_add_(1, moved.clamp_(0, self.num_bins - 1), self.counts)

    def state(self) -> dict[str, torch.Tensor]:
        """The state as named tensors, exact: `load_state` takes it back."""
        return {name: getattr(self, name) for name in ("counts", "exponent", "start", "low", "high", "below", "above")}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Take the state `state()` gave (the same bins and features)."""
        for name, value in state.items():
            setattr(self, name, value.clone())

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the state holds (to measure its memory)."""
        return list(self.state().values())


def _bin_numbers(values: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """floor(value / 2**exponent) per feature (last dimension), as int64; 0 where not finite."""
    scaled = torch.ldexp(values, (-exponent).double()).floor_()
    return scaled.nan_to_num_(0.0, 0.0, 0.0).long()


def _exponent(low: torch.Tensor, high: torch.Tensor, num_bins: int, at_least: torch.Tensor) -> torch.Tensor:
    """Per feature, the smallest exponent e >= `at_least` (and no finer than _FINEST below
    the largest magnitude) whose grid puts low and high at most num_bins - 1 bins apart;
    `at_least` where a feature had no finite value."""
    seen = low.isfinite()
    low, high = torch.where(seen, low, 0.0), torch.where(seen, high, 0.0)
    magnitude = torch.maximum(low.abs(), high.abs())
    finest = torch.where(magnitude > 0, torch.frexp(magnitude).exponent.long() - _FINEST, _LOWEST_EXPONENT)
    span = ((high - low) / num_bins).log2().floor_().nan_to_num_(0.0, 0.0, float(_LOWEST_EXPONENT))
    exponent = torch.maximum(torch.maximum(at_least, finest), span.long()).clamp_(min=_LOWEST_EXPONENT)
    for _ in range(2100):  # a few steps from the estimate; 2100 bounds any float64 range
        apart = _bin_numbers(high, exponent) - _bin_numbers(low, exponent)
        wide = apart > num_bins - 1
        if not bool(wide.any()):
            break
        exponent = exponent + wide.long()
    return torch.where(seen, exponent, at_least)
