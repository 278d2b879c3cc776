"""Per-feature running statistics of a stream of sample rows, in float64, mergeable in any order.

Mean and variance merge with Chan, Golub and LeVeque's pairwise update (each batch's own
mean and sum of squared deviations, then one correction term per merge), so no sum of
squares of raw values is ever formed and the variance stays accurate when the mean is large
next to the spread. The other statistics are sums, counts or extremes, merged by adding or
comparing. The state's size depends only on the number of features.
"""
from __future__ import annotations

from collections.abc import Collection

import torch

__all__ = ["ELEMENTWISE", "Moments"]

# The statistics this module gives, each a tensor of the site's kept shape unless noted.
ELEMENTWISE = ("mean", "var", "std", "min", "max", "abs_mean", "zeros", "nonfinite", "norm")

_F64 = torch.float64


class Moments:
    """Count, mean and sum of squared deviations per feature, plus what `wanted` names of
    min, max, mean of absolute values, fraction of zeros and of non-finite values, and the
    L2 norm of each row (a sample's vector of kept features: its mean and root mean square).

    Example:
        >>> m = Moments(2, {"mean", "var"})
        >>> m.add(torch.tensor([[1.0, 2.0], [3.0, 6.0]], dtype=torch.float64))
        >>> m.add(torch.tensor([[5.0, 10.0]], dtype=torch.float64))
        >>> m.results()["mean"].tolist(), m.results()["var"].tolist()
        ([3.0, 6.0], [2.6666666666666665, 10.666666666666666])
    """

    def __init__(self, num_features: int, wanted: Collection[str]) -> None:
        self.wanted = frozenset(wanted)
        self.count = 0
        self.mean = torch.zeros(num_features, dtype=_F64)
        self.m2 = torch.zeros(num_features, dtype=_F64)  # sum of squared deviations from the mean
        self.extra: dict[str, torch.Tensor] = {}  # sums, counts and extremes, by name
        if "min" in self.wanted:
            self.extra["min"] = torch.full((num_features,), float("inf"), dtype=_F64)
        if "max" in self.wanted:
            self.extra["max"] = torch.full((num_features,), float("-inf"), dtype=_F64)
        for name in ("abs_mean", "zeros", "nonfinite"):
            if name in self.wanted:
                self.extra[name] = torch.zeros(num_features, dtype=_F64)  # a sum / a count
        if "norm" in self.wanted:
            self.extra["norm"] = torch.zeros(2, dtype=_F64)  # sum of row norms, sum of squared row norms

    def add(self, rows: torch.Tensor) -> None:
        """Add a float64 matrix of samples (rows) by features (columns)."""
        if rows.shape[0] == 0:
            return
        other = Moments.__new__(Moments)
        other.wanted, other.count = self.wanted, rows.shape[0]
        other.mean = rows.mean(dim=0)
        other.m2 = (rows - other.mean).square_().sum(dim=0)
        other.extra = _batch_extras(rows, self.extra)
        self.merge(other)

    def merge(self, other: Moments) -> None:
        """Fold `other` (the same features and statistics) into this one."""
        if other.count == 0:
            return
        if self.count == 0:
            self.count, self.mean, self.m2 = other.count, other.mean.clone(), other.m2.clone()
        else:
            total = self.count + other.count
            delta = other.mean - self.mean
            self.mean = self.mean + delta * (other.count / total)
            self.m2 = self.m2 + other.m2 + delta.square() * (self.count * other.count / total)
            self.count = total
        for name, value in other.extra.items():
            mine = self.extra[name]
            if name == "min":  # torch.minimum and maximum keep NaN, as numpy's min and max do
                torch.minimum(mine, value, out=mine)
            elif name == "max":
                torch.maximum(mine, value, out=mine)
            else:
                mine += value

    def results(self) -> dict[str, torch.Tensor]:
        """The statistics asked for, per feature (float64); `norm` is [mean, rms] of the
        rows' L2 norms. Variance and std are the population ones (divided by the count)."""
        found: dict[str, torch.Tensor] = {"mean": self.mean.clone()}
        var = self.m2 / self.count if self.count else torch.full_like(self.m2, float("nan"))
        if "var" in self.wanted:
            found["var"] = var
        if "std" in self.wanted:
            found["std"] = var.sqrt()
        for name, value in self.extra.items():
            if name in ("min", "max"):
                found[name] = value.clone()
            elif name == "norm":
                found["norm"] = torch.stack([value[0] / self.count, (value[1] / self.count).sqrt()])
            else:
                found[name] = value / self.count
        return found

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the state holds (to measure its memory)."""
        return [self.mean, self.m2, *self.extra.values()]

    def state(self) -> dict[str, torch.Tensor]:
        """The state as named tensors (the count 0-d int64), exact: `load_state` takes it back."""
        return {"count": torch.tensor(self.count), "mean": self.mean, "m2": self.m2,
                **{f"extra.{name}": value for name, value in self.extra.items()}}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Take the state `state()` gave (the same features and statistics)."""
        self.count = int(state["count"])
        self.mean, self.m2 = state["mean"].clone(), state["m2"].clone()
        self.extra = {name: state[f"extra.{name}"].clone() for name in self.extra}


def _batch_extras(rows: torch.Tensor, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The extra statistics of one batch of rows, for the names `like` holds."""
    found: dict[str, torch.Tensor] = {}
    if "min" in like:
        found["min"] = rows.amin(dim=0)
    if "max" in like:
        found["max"] = rows.amax(dim=0)
    if "abs_mean" in like:
        found["abs_mean"] = rows.abs().sum(dim=0)
    if "zeros" in like:
        found["zeros"] = (rows == 0).sum(dim=0, dtype=_F64)
    if "nonfinite" in like:
        found["nonfinite"] = (~rows.isfinite()).sum(dim=0, dtype=_F64)
    if "norm" in like:
        squared = rows.square().sum(dim=1)
        found["norm"] = torch.stack([squared.sqrt().sum(), squared.sum()])
    return found
