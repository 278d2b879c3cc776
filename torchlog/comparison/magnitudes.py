"""How large a tensor is, without overflow or underflow: its largest modulus and its L2 norm."""
from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache
from typing import NamedTuple

import torch

__all__ = ["Magnitude", "magnitudes", "extremes"]


class Magnitude(NamedTuple):
    """max |t| and ||t|| of a tensor. The norm is kept as ||t|| / max |t| (between 1 and
    sqrt(numel)), so neither figure overflows or underflows a Python float where the
    tensor's own dtype would: the norm of a float32 tensor holding finfo.min is about
    3.4e38, its square is not a float32.
    """

    peak: float  # max |t| (or ||t||, see `magnitudes`); inf or NaN when the tensor holds one
    spread: float  # ||t|| / max |t|; 0.0 for a tensor of zeros, NaN when peak is not finite

    @property
    def is_finite(self) -> bool:
        return math.isfinite(self.peak)

    def times(self, factor: float) -> Magnitude:
        """The magnitude of the tensor times `factor` (a positive float)."""
        return Magnitude(self.peak * factor, self.spread)

    def ratio(self, other: Magnitude) -> float:
        """||self|| / ||other||: 0.0 when this tensor is all zeros, inf when only `other` is."""
        if self.peak == 0.0:
            return 0.0
        if other.peak == 0.0:
            return math.inf
        return (self.peak / other.peak) * (self.spread / other.spread)


def magnitudes(tensors: Sequence[torch.Tensor], norm_only: Sequence[torch.Tensor] = ()
               ) -> list[Magnitude]:
    """The magnitude of each tensor (float or complex, any layout), read back at once.

    The extremes and norms of `tensors`, and the norms alone of `norm_only`, are reduced in
    their own dtype and read in one device sync. A norm whose sum of squares could overflow
    the dtype, or lose precision to underflow (values near finfo.max or finfo.tiny), is
    worked out again on the tensor divided by its largest modulus, where every square is
    at most 1. A tensor of `norm_only` whose norm is exact as it is gets the norm as its
    `peak` (any scale of at least max |t| serves the ratios) and a spread of 1.

    Example:
        >>> big = torch.full((4,), torch.finfo(torch.float32).min)
        >>> torch.linalg.vector_norm(big).item(), magnitudes([big])[0]
        (inf, Magnitude(peak=3.4028234663852886e+38, spread=2.0))
    """
    parts = [part for t in tensors for part in (*extremes(t), torch.linalg.vector_norm(t))]
    parts += [torch.linalg.vector_norm(t) for t in norm_only]
    read = torch.stack(parts).tolist() if parts else []
    found = [_magnitude(t, max(-read[3 * i], read[3 * i + 1]), read[3 * i + 2])
             for i, t in enumerate(tensors)]
    for t, norm in zip(norm_only, read[3 * len(tensors):]):
        # A finite norm never overflowed: an overflowed square or sum stays inf.
        exact = math.isfinite(norm) and _above_underflow(norm * norm, t.numel(), t.dtype)
        found.append(Magnitude(norm, 1.0) if exact else magnitudes([t])[0])
    return found


def extremes(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The least and greatest of a real tensor; 0 and the largest modulus of a complex one."""
    if not t.is_complex():
        return torch.aminmax(t)  # several times faster than an inf-norm on CPU
    size = t.abs()
    return torch.zeros((), dtype=size.dtype, device=size.device), size.max()


def _magnitude(t: torch.Tensor, peak: float, norm: float) -> Magnitude:
    if not math.isfinite(peak):
        return Magnitude(peak, math.nan)
    if peak == 0.0:
        return Magnitude(0.0, 0.0)
    if _norm_is_exact(peak, t.numel(), t.dtype):
        return Magnitude(peak, norm / peak)
    # Scaled, every |value| is at most 1: nothing overflows, and what underflows is below
    # finfo.tiny next to a peak of 1, too small to move the norm.
    return Magnitude(peak, float(torch.linalg.vector_norm(t / peak)))


def _norm_is_exact(peak: float, numel: int, dtype: torch.dtype) -> bool:
    """Whether a sum of `numel` squares of values at most `peak` stays below the dtype's
    largest value, and its smallest normal values add less than an epsilon to it."""
    square = peak * peak  # a Python float: inf or 0.0 past its own range, then not exact
    return numel * square <= _range(dtype)[0] / 2 and _above_underflow(square, numel, dtype)


def _above_underflow(square: float, numel: int, dtype: torch.dtype) -> bool:
    """Whether a sum of squares of at least `square` loses less than an epsilon to the
    squares below the dtype's smallest normal value (at most finfo.tiny each)."""
    _, tiny, eps = _range(dtype)
    return square >= numel * tiny / eps


@cache
def _range(dtype: torch.dtype) -> tuple[float, float, float]:
    info = torch.finfo(dtype)  # of the real part for complex dtypes
    return info.max, info.tiny, info.eps
