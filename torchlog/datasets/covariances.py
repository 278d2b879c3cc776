"""Covariance of a stream of sample rows, its principal directions, and linear CKA between two streams.

Each keeps a count, the means and the co-moment matrices (sums of products of deviations
from the means) in float64, merged with Chan et al.'s pairwise update: the co-moment of two
parts is the sum of theirs plus the outer product of the difference of their means, scaled
by n_a * n_b / n. The state is features x features, whatever the number of samples.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError

__all__ = ["Covariance", "CovarianceState", "CrossCovariance", "covariance"]

_F64 = torch.float64
DEFAULT_MAX_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class Covariance:
    """The covariance statistic: the features x features covariance (divided by the count,
    as numpy's `cov(bias=True)`), and its `num_components` top principal directions.
    A covariance whose float64 state would pass `max_bytes` is refused."""

    num_components: int = 8
    max_bytes: int = DEFAULT_MAX_BYTES


def covariance(num_components: int = 8, max_bytes: int = DEFAULT_MAX_BYTES) -> Covariance:
    """A covariance statistic for `statistics(stats=[...])`, with its top `num_components`
    principal directions (unit eigenvectors, largest eigenvalue first).

    Raises:
        InvalidArgumentTypeError: a count that is not an int.
        InvalidOptionError: num_components < 0 or max_bytes < 1.

    Example:
        >>> covariance(2).num_components
        2
    """
    for name, value in (("num_components", num_components), ("max_bytes", max_bytes)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgumentTypeError(f"covariance({name}=...) takes an int, got {value!r}")
    if num_components < 0 or max_bytes < 1:
        raise InvalidOptionError(f"covariance needs num_components >= 0 and max_bytes >= 1, got "
                                 f"num_components={num_components!r}, max_bytes={max_bytes!r}")
    return Covariance(num_components, max_bytes)


def check_size(widths: tuple[int, ...], max_bytes: int, what: str) -> None:
    """Refuse co-moment matrices of these widths (all pairs) above `max_bytes` of float64.

    Raises:
        InvalidOptionError: naming `what`, the features and the memory it would need.
    """
    needed = 8 * sum(a * b for a in widths for b in widths if a <= b)
    if needed > max_bytes:
        raise InvalidOptionError(
            f"{what} over {' and '.join(str(w) for w in widths)} features would keep "
            f"{needed / 2**30:.2f} GiB of float64 state, above max_bytes={max_bytes}; keep fewer "
            "features (a narrower site or another reduce=), or raise max_bytes with covariance(max_bytes=...)")


class CovarianceState:
    """Count, mean and co-moment matrix of one stream of rows."""

    def __init__(self, num_features: int) -> None:
        self.count = 0
        self.mean = torch.zeros(num_features, dtype=_F64)
        self.comoment = torch.zeros(num_features, num_features, dtype=_F64)

    def add(self, rows: torch.Tensor) -> None:
        """Add a float64 matrix of samples (rows) by features (columns)."""
        if rows.shape[0] == 0:
            return
        other = CovarianceState.__new__(CovarianceState)
        other.count, other.mean = rows.shape[0], rows.mean(dim=0)
        centered = rows - other.mean
        other.comoment = centered.T @ centered
        self.merge(other)

    def merge(self, other: CovarianceState) -> None:
        """Fold `other` (the same features) into this one."""
        if other.count == 0:
            return
        total = self.count + other.count
        delta = other.mean - self.mean
        self.comoment = self.comoment + other.comoment + torch.outer(delta, delta) * (self.count * other.count / total)
        self.mean = self.mean + delta * (other.count / total)
        self.count = total

    def results(self, num_components: int) -> dict[str, torch.Tensor]:
        """`covariance` (divided by the count), `components` (num_components x features,
        unit rows, largest variance first, each signed so that its largest entry is
        positive) and `explained_variance` (their eigenvalues)."""
        cov = self.comoment / self.count
        found = {"covariance": cov}
        if num_components:
            values, vectors = torch.linalg.eigh(cov)
            k = min(num_components, cov.shape[0])
            top = vectors[:, -k:].flip(1).T.contiguous()
            signs = top.gather(1, top.abs().argmax(dim=1, keepdim=True)).sign()
            found["components"] = top * torch.where(signs == 0, 1.0, signs)
            found["explained_variance"] = values[-k:].flip(0)
        return found

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the state holds (to measure its memory)."""
        return [self.mean, self.comoment]

    def state(self) -> dict[str, torch.Tensor]:
        """The state as named tensors, exact: `load_state` takes it back."""
        return {"count": torch.tensor(self.count), "mean": self.mean, "comoment": self.comoment}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Take the state `state()` gave (the same features)."""
        self.count = int(state["count"])
        self.mean, self.comoment = state["mean"].clone(), state["comoment"].clone()


class CrossCovariance:
    """What linear CKA between two streams of rows needs: both streams' co-moments and
    their cross co-moment, from paired rows (row i of one is the same sample as row i of
    the other)."""

    def __init__(self, width_x: int, width_y: int) -> None:
        self.x, self.y = CovarianceState(width_x), CovarianceState(width_y)
        self.cross = torch.zeros(width_x, width_y, dtype=_F64)

    def add(self, rows_x: torch.Tensor, rows_y: torch.Tensor) -> None:
        """Add paired float64 row matrices (the same number of rows)."""
        if rows_x.shape[0] == 0:
            return
        batch = CrossCovariance(rows_x.shape[1], rows_y.shape[1])
        batch.x.add(rows_x)
        batch.y.add(rows_y)
        batch.cross = (rows_x - batch.x.mean).T @ (rows_y - batch.y.mean)
        self.merge(batch)

    def merge(self, other: CrossCovariance) -> None:
        """Fold `other` (the same widths, fed other samples) into this one: the cross
        co-moment takes the same pairwise correction as each stream's own."""
        n_a, n_b = self.x.count, other.x.count
        if n_b == 0:
            return
        delta_x, delta_y = other.x.mean - self.x.mean, other.y.mean - self.y.mean
        self.cross = self.cross + other.cross + torch.outer(delta_x, delta_y) * (n_a * n_b / (n_a + n_b))
        self.x.merge(other.x)
        self.y.merge(other.y)

    def cka(self) -> float:
        """Linear CKA: ||Xc' Yc||_F^2 / (||Xc' Xc||_F ||Yc' Yc||_F) over the centred samples."""
        num = torch.linalg.matrix_norm(self.cross).square()
        den = torch.linalg.matrix_norm(self.x.comoment) * torch.linalg.matrix_norm(self.y.comoment)
        return float(num / den)

    def tensors(self) -> list[Any]:
        """Every tensor the state holds (to measure its memory)."""
        return [self.cross, *self.x.tensors(), *self.y.tensors()]

    def state(self) -> dict[str, torch.Tensor]:
        """The state as named tensors, exact: `load_state` takes it back."""
        return {"cross": self.cross, **{f"x.{k}": v for k, v in self.x.state().items()},
                **{f"y.{k}": v for k, v in self.y.state().items()}}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Take the state `state()` gave (the same widths)."""
        self.cross = state["cross"].clone()
        for name, part in (("x", self.x), ("y", self.y)):
            part.load_state({k[2:]: v for k, v in state.items() if k.startswith(f"{name}.")})
