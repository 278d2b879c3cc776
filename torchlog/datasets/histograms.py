"""Histograms per feature over a stream of sample rows: the statistic, and its counts over fixed bins.

Bins learned from the data are counted by learned_histograms.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError

__all__ = ["Histogram", "HistogramCounts", "histogram"]


@dataclass(frozen=True, slots=True)
class Histogram:
    """`num_bins` equal bins from `low` to `high`, each holding its lower edge and the last
    its upper edge too (numpy's `histogram(range=(low, high))`); values outside, and NaN,
    are counted apart (`below`, `above`; NaN in neither). With low and high None, the bins
    are learned from the data, per feature (learned_histograms.py)."""

    low: float | None
    high: float | None
    num_bins: int

    @property
    def is_learned(self) -> bool:
        """Whether the bins are learned from the data."""
        return self.low is None

    def edges(self) -> torch.Tensor:
        """The bin edges in float64: low + k * (high - low) / num_bins, the last exactly high
        (numpy's linspace, computed the same way on every machine).

        Raises:
            InvalidOptionError: learned bins, whose edges come from the data.
        """
        if self.is_learned:
            raise InvalidOptionError("learned histogram bins have edges per feature, known from the data only: "
                                     "read `histogram_edges` of the statistics instead")
        step = (self.high - self.low) / self.num_bins
        edges = torch.arange(self.num_bins + 1, dtype=torch.float64) * step + self.low
        edges[-1] = self.high
        return edges


def histogram(low: float | None = None, high: float | None = None, num_bins: int = 64) -> Histogram:
    """A histogram statistic for `statistics(stats=[...])`: per feature, `num_bins` equal bins
    from `low` to `high`; without low and high, `num_bins` equal bins learned from the data
    per feature, which lose no finite value (docs/datasets.md, learned_histograms.py).

    Raises:
        InvalidArgumentTypeError: low or high not a number, num_bins not an int.
        InvalidOptionError: only one of low and high, low >= high, a non-finite bound, or
            num_bins < 1 (< 2 for learned bins).

    Example:
        >>> histogram(-1, 1, 4).edges().tolist()
        [-1.0, -0.5, 0.0, 0.5, 1.0]
        >>> histogram(num_bins=32).is_learned
        True
    """
    if isinstance(num_bins, bool) or not isinstance(num_bins, int):
        raise InvalidArgumentTypeError(f"histogram(num_bins=...) takes an int, got {num_bins!r}")
    if low is None and high is None:
        if num_bins < 2:
            raise InvalidOptionError(f"learned histogram bins need num_bins >= 2 (values on both sides of 0 "
                                     f"never share a bin), got {num_bins!r}")
        return Histogram(None, None, num_bins)
    if low is None or high is None:
        raise InvalidOptionError(f"histogram needs both low and high (fixed bins) or neither (bins learned "
                                 f"from the data), got low={low!r}, high={high!r}")
    for name, value in (("low", low), ("high", high)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidArgumentTypeError(f"histogram({name}=...) takes a number, got {value!r}")
    if not (float("-inf") < low < high < float("inf")):
        raise InvalidOptionError(f"histogram needs finite low < high, got low={low!r}, high={high!r}")
    if num_bins < 1:
        raise InvalidOptionError(f"histogram(num_bins=...) must be at least 1, got {num_bins!r}")
    return Histogram(float(low), float(high), num_bins)


class HistogramCounts:
    """The counts of one Histogram per feature: `counts` (features, bins), `below` and
    `above` (features,), all int64."""

    def __init__(self, spec: Histogram, num_features: int) -> None:
        self.spec = spec
        self._edges = spec.edges()
        self.counts = torch.zeros(num_features, spec.num_bins, dtype=torch.int64)
        self.below = torch.zeros(num_features, dtype=torch.int64)
        self.above = torch.zeros(num_features, dtype=torch.int64)

    def add(self, rows: torch.Tensor) -> None:
        """Count a float64 matrix of samples (rows) by features (columns)."""
        num_features, num_bins = self.counts.shape
        spec, edges = self.spec, self._edges
        self.below += (rows < spec.low).sum(dim=0)
        self.above += (rows > spec.high).sum(dim=0)
        inside = (rows >= spec.low) & (rows <= spec.high)
        bins = ((rows - spec.low) * (num_bins / (spec.high - spec.low))).floor_()
        bins = bins.nan_to_num_(0.0).clamp_(0, num_bins - 1).long()
        # The scaled index can miss by one next to an edge: settle it against the edges.
        bins -= (rows < edges[bins]).long()
        bins += ((rows >= edges[bins + 1]) & (bins != num_bins - 1)).long()
        feature = torch.arange(num_features).expand_as(bins)
        flat = (feature * num_bins + bins)[inside]
        self.counts += torch.bincount(flat, minlength=num_features * num_bins).view(num_features, num_bins)

    def edges(self) -> torch.Tensor:
        """The bin edges, (bins + 1,) float64, shared by every feature."""
        return self._edges

    def merge(self, other: HistogramCounts) -> None:
        """Add `other`'s counts (the same spec and features)."""
        self.counts += other.counts
        self.below += other.below
        self.above += other.above

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the state holds (to measure its memory)."""
        return [self.counts, self.below, self.above, self._edges]

    def state(self) -> dict[str, torch.Tensor]:
        """The state as named tensors, exact: `load_state` takes it back."""
        return {"counts": self.counts, "below": self.below, "above": self.above}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Take the state `state()` gave (the same spec and features)."""
        self.counts, self.below, self.above = (state[k].clone() for k in ("counts", "below", "above"))
