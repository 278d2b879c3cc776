"""Quantiles per feature from a mergeable compactor sketch, with a rank error it tracks itself.

The sketch keeps levels of samples: level h holds values that each stand for 2**h samples.
New samples go to level 0; a level that reaches 2k values is sorted and every other value
(the even or the odd ones, alternately) moves up a level, so each level keeps fewer than 2k.
All features see the same number of samples, so every feature's levels have the same sizes
and one sort along the last dimension serves them all.

Error bound: compacting sorted values of weight w changes the weighted count of values at
or below any point by at most w. The sketch adds w to `rank_error` at every compaction, so
for every x the estimated number of samples <= x is within `rank_error` of the true one,
and the value given for quantile q has a true rank within q * count +- rank_error (+1).
Worst case: rank_error / count <= log2(count / k) / (2k); alternating the kept half
cancels most of it in practice. Memory per feature: < 2k values per level, log2(count / k)
levels: it grows with the logarithm of the dataset's length, not with the length.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError

__all__ = ["QuantileSketch", "Quantiles", "quantiles"]


@dataclass(frozen=True, slots=True)
class Quantiles:
    """The quantiles statistic: `levels` in [0, 1], sketch size `k`."""

    levels: tuple[float, ...]
    k: int


def quantiles(levels: Sequence[float] = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99), k: int = 256) -> Quantiles:
    """A quantiles statistic for `statistics(stats=[...])`: per feature, the values at
    `levels`, from a sketch of size `k` (larger: smaller rank error, more memory).

    Raises:
        InvalidArgumentTypeError: levels not numbers, or k not an int.
        InvalidOptionError: a level outside [0, 1], no level, or k < 2.

    Example:
        >>> quantiles([0.5], k=64).levels
        (0.5,)
    """
    if isinstance(levels, (int, float)) and not isinstance(levels, bool):
        levels = [levels]
    if not isinstance(levels, Sequence) or not levels or any(
            isinstance(q, bool) or not isinstance(q, (int, float)) for q in levels):
        raise InvalidArgumentTypeError(f"quantiles(levels=...) takes a non-empty list of numbers, got {levels!r}")
    if any(not 0 <= q <= 1 for q in levels):
        raise InvalidOptionError(f"quantiles(levels=...) must lie in [0, 1], got {list(levels)!r}")
    if isinstance(k, bool) or not isinstance(k, int):
        raise InvalidArgumentTypeError(f"quantiles(k=...) takes an int, got {k!r}")
    if k < 2:
        raise InvalidOptionError(f"quantiles(k=...) must be at least 2, got {k!r}")
    return Quantiles(tuple(float(q) for q in levels), k)


class QuantileSketch:
    """A compactor sketch of each feature of a stream of sample rows.

    Example:
        >>> sketch = QuantileSketch(1, k=8)
        >>> sketch.add(torch.arange(1000, dtype=torch.float64)[:, None])
        >>> value = float(sketch.quantiles([0.5])[0, 0])
        >>> abs(value - 500) <= sketch.rank_error + 1
        True
    """

    def __init__(self, num_features: int, k: int) -> None:
        self.k = k
        self.count = 0
        self.rank_error = 0  # the most the estimated rank of any value can be off, in samples
        self.levels: list[torch.Tensor] = [torch.empty(num_features, 0, dtype=torch.float64)]
        self._odd: list[bool] = [False]  # which half each level keeps at its next compaction

    def add(self, rows: torch.Tensor) -> None:
        """Add a float64 matrix of samples (rows) by features (columns)."""
        self.count += rows.shape[0]
        self.levels[0] = torch.cat([self.levels[0], rows.T], dim=1)
        self._compact()

    def merge(self, other: QuantileSketch) -> None:
        """Fold `other` (the same features and k) into this one."""
        for height, values in enumerate(other.levels):
            self._level(height)
            self.levels[height] = torch.cat([self.levels[height], values], dim=1)
        self.count += other.count
        self.rank_error += other.rank_error
        self._compact()

    def quantiles(self, levels: Sequence[float]) -> torch.Tensor:
        """(len(levels), features): per feature, the smallest kept value whose estimated
        rank reaches q * count (NaN sorts above every number)."""
        weights = torch.cat([torch.full((v.shape[1],), float(1 << h), dtype=torch.float64)
                             for h, v in enumerate(self.levels)])
        values = torch.cat(self.levels, dim=1)
        ordered, order = values.sort(dim=1)
        ranks = weights[order].cumsum(dim=1)
        wanted = torch.tensor([[q * self.count for q in levels]], dtype=torch.float64).expand(len(ordered), -1)
        at = torch.searchsorted(ranks, wanted.contiguous()).clamp_(max=ordered.shape[1] - 1)
        return ordered.gather(1, at).T.contiguous()

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the state holds (to measure its memory)."""
        return list(self.levels)

    def state(self) -> dict[str, torch.Tensor]:
        """The state as named tensors, exact: `load_state` takes it back."""
        return {"count": torch.tensor(self.count), "rank_error": torch.tensor(self.rank_error),
                "odd": torch.tensor(self._odd), **{f"level.{h}": v for h, v in enumerate(self.levels)}}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Take the state `state()` gave (the same features and k)."""
        self.count, self.rank_error = int(state["count"]), int(state["rank_error"])
        self._odd = [bool(flag) for flag in state["odd"].tolist()]
        self.levels = [state[f"level.{h}"].clone() for h in range(len(self._odd))]

    def _level(self, height: int) -> None:
        while len(self.levels) <= height:
            self.levels.append(torch.empty(self.levels[0].shape[0], 0, dtype=torch.float64))
            self._odd.append(False)

    def _compact(self) -> None:
        height = 0
        while height < len(self.levels):
            values = self.levels[height]
            if values.shape[1] >= 2 * self.k:
                even = values.shape[1] - values.shape[1] % 2
                ordered = values.sort(dim=1).values
                start = int(self._odd[height])
                self._odd[height] = not self._odd[height]
                self._level(height + 1)
                self.levels[height + 1] = torch.cat([self.levels[height + 1], ordered[:, start:even:2]], dim=1)
                self.levels[height] = ordered[:, even:]
                self.rank_error += 1 << height
            height += 1
