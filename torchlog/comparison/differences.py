"""How far apart two values of one pass are: max absolute and relative difference, relative L2, cosine."""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from torchlog.comparison.magnitudes import Magnitude, magnitudes
from torchlog.comparison.tolerances import Tolerance

__all__ = ["Difference", "Reference", "difference", "fills", "working_dtype", "SAME"]


class Difference(NamedTuple):
    """How `b` differs from `a`, computed in the wider of their dtypes, without overflow or
    underflow (see `torchlog.comparison.magnitudes`): a value holding finfo.min has a norm.

    Differences are taken where both values are finite; NaN and Inf must sit at the same
    places with the same sign, or every figure is inf (cosine NaN). A mask's fills (each
    value's own dtype's finfo.min or finfo.max, as an additive attention mask holds them)
    at the same places with the same signs are left out of every figure, `max |a|`
    included, so a masked add is judged by its other values; fills at other places are
    values like any other (a mask that moved differs by about finfo.max).
    """

    max_abs: float  # max |a - b|
    max_rel: float  # max |a - b| / max |a|: the largest difference next to the size of a
    rel_l2: float  # ||a - b|| / ||a||
    cosine: float  # <a, b> / (||a|| ||b||); 1.0 when both are all zeros

    def within(self, tolerance: Tolerance) -> bool:
        """Whether max |a - b| <= atol + rtol * max |a|."""
        if self.max_abs <= tolerance.atol:
            return True
        if tolerance.rtol == 0.0:
            return False
        if self.max_rel <= tolerance.rtol:
            return True
        # With max |a| = max_abs / max_rel, kept out of the sum: it may pass a float's
        # range (max_rel underflows) where the test itself does not.
        return self.max_abs * (1.0 - tolerance.rtol / self.max_rel) <= tolerance.atol


SAME = Difference(0.0, 0.0, 0.0, 1.0)
_APART = Difference(math.inf, math.inf, math.inf, math.nan)
# Up to this |r - 1/r| + q, the cosine is taken from the norms (see `_cosine`).
_NORMS_CLOSE = 1.0


def difference(a: torch.Tensor, b: torch.Tensor) -> Difference:
    """How `b` differs from `a`, two tensors of one shape (any dtypes, devices).

    Example:
        >>> found = difference(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]))
        >>> found.max_abs, found.max_rel, round(found.rel_l2, 4), round(found.cosine, 4)
        (0.5, 0.25, 0.2236, 0.9965)

    Raises:
        ValueError: the shapes differ.
    """
    return Reference(a).difference(b)


class Reference:
    """A value of run a, compared with several values: its partner's in run b, then b's op
    re-run for the local error. Its conversion to the working dtype, its largest size and
    its norm are worked out once, for the first value compared with it.
    """

    __slots__ = ("value", "_work", "_figures", "_fills")

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value.detach()
        self._work: tuple[torch.dtype, torch.Tensor] | None = None
        self._figures: Magnitude | None = None  # of that conversion (of its values but fills)
        self._fills: torch.Tensor | None = None  # where it holds a mask's fills, once it was seen to

    @property
    def peak(self) -> float | None:
        """max |value| (a mask's fills included), once a value that differs from it was
        compared; else None."""
        if self._fills is not None:
            return _fill_size(self.value.dtype)
        return None if self._figures is None else self._figures.peak

    def difference(self, b: torch.Tensor) -> Difference:
        """How `b` differs from this value (see `difference`).

        Raises:
            ValueError: the shapes differ.
        """
        a = self.value
        if a.shape != b.shape:
            raise ValueError(f"values of shape {tuple(a.shape)} and {tuple(b.shape)} cannot be compared")
        b = b.detach().to(a.device)
        # torch.equal stops at the first unequal element: cheap for values that differ.
        if a.numel() == 0 or (a.dtype == b.dtype and torch.equal(a, b)):  # NaN never equals NaN
            return SAME
        work = working_dtype(a.dtype, b.dtype)
        if self._work is None or self._work[0] != work:
            self._work, self._figures = (work, a.to(work)), None  # any layout: no flat copy needed
        x, y = self._work[1], b.to(work)
        if self._fills is None:
            found, self._figures = _figures(x, y, self._figures)
            # A fill is the largest finite size there is: only a peak at it (or, with a NaN
            # or Inf hiding the peak, a look) can reveal one.
            holds = self._figures.peak == _fill_size(a.dtype) if found is not None else bool(fills(a).any())
            if not holds:  # the usual case
                return found if found is not None else _nonfinite_figures(x, y)
            self._fills, self._figures = fills(a), None  # left out from now on
        if not torch.equal(fills(b), self._fills):  # a mask at other places, or of the other sign:
            found, _ = _figures(x, y, None)  # the figures of every value, fills and all
            return found if found is not None else _nonfinite_figures(x, y)
        kept = self._fills == 0
        if not bool(kept.any()):
            return SAME
        x, y = x[kept], y[kept]
        found, self._figures = _figures(x, y, self._figures)
        return found if found is not None else _nonfinite_figures(x, y)


def fills(t: torch.Tensor) -> torch.Tensor:
    """Where `t` holds its dtype's finfo.max (1) or finfo.min (-1), as a mask fills the places
    it hides; 0 elsewhere (and everywhere for integers)."""
    if not t.dtype.is_floating_point:
        return torch.zeros(t.shape, dtype=torch.int8, device=t.device)
    info = torch.finfo(t.dtype)
    return (t == info.max).to(torch.int8) - (t == info.min).to(torch.int8)


def _fill_size(dtype: torch.dtype) -> float:
    """|fill| of a float dtype (its finfo.max), NaN for others (equal to no peak)."""
    return float(torch.finfo(dtype).max) if dtype.is_floating_point else math.nan


def working_dtype(first: torch.dtype, second: torch.dtype) -> torch.dtype:
    """float32 for values of at most 32-bit floats, float64 (complex128) for wider or
    integer values, complex64 for complex values of at most 64 bits."""
    wide = any(d.itemsize > 4 if d.is_floating_point else d.itemsize > 8 if d.is_complex else True
               for d in (first, second))
    if first.is_complex or second.is_complex:
        return torch.complex128 if wide else torch.complex64
    return torch.float64 if wide else torch.float32


def _figures(x: torch.Tensor, y: torch.Tensor, known: Magnitude | None
             ) -> tuple[Difference | None, Magnitude]:
    """The figures of two tensors of the working dtype (None when either holds a NaN or
    Inf), and the magnitude of `x`, worked out unless `known` gives it.

    The difference's and `x`'s extremes and norms and `y`'s norm are read back at once
    (one device sync); the dot product comes from the norms, as
    ||a - b||^2 = ||a||^2 + ||b||^2 - 2 <a, b>, unless that loses precision. Finite values
    whose difference overflows the dtype (finfo.max against finfo.min) are halved first.
    """
    diff = x - y
    found = magnitudes((diff,) if known is not None else (diff, x), norm_only=(y,))
    size_d, size_b = found[0], found[-1]
    size_a = known if known is not None else found[1]
    if not (size_a.is_finite and size_b.is_finite):
        return None, size_a
    scale_a, scale_b, max_abs = size_a, size_b, size_d.peak
    if not size_d.is_finite:  # figures of the halves: max_abs alone may pass a float's range
        size_d = magnitudes([x * 0.5 - y * 0.5])[0]
        scale_a, scale_b, max_abs = size_a.times(0.5), size_b.times(0.5), 2.0 * size_d.peak
    if max_abs == 0.0:  # equal values (-0.0 and 0.0, or of two dtypes): cosine exactly 1
        return SAME, size_a
    rel_a, rel_b = size_d.ratio(scale_a), size_d.ratio(scale_b)
    return Difference(max_abs, _ratio(size_d.peak, scale_a.peak), rel_a,
                      _cosine(x, y, size_a, size_b, rel_a * rel_b)), size_a


def _nonfinite_figures(x: torch.Tensor, y: torch.Tensor) -> Difference:
    """Figures over the places where both are finite, when the others agree (NaN with
    NaN, +Inf with +Inf); every figure apart otherwise."""
    finite_x, finite_y = torch.isfinite(x), torch.isfinite(y)
    same_nan = torch.isnan(x) & torch.isnan(y)
    same_inf = torch.isinf(x) & (x == y)
    if not bool(((finite_x & finite_y) | same_nan | same_inf).all()):
        return _APART
    keep = finite_x & finite_y
    if not bool(keep.any()):
        return SAME
    found, _ = _figures(x[keep], y[keep], None)
    assert found is not None  # the values kept are finite
    return found


def _ratio(part: float, whole: float) -> float:
    if part == 0.0:
        return 0.0
    return part / whole if whole > 0.0 else math.inf


def _cosine(x: torch.Tensor, y: torch.Tensor, size_a: Magnitude, size_b: Magnitude,
            q: float) -> float:
    """<a, b> / (||a|| ||b||) from the magnitudes of a and b and q = ||a - b||^2 / (||a|| ||b||).

    From the norms it is (r + 1/r - q) / 2 with r = ||a|| / ||b||; an error e in the norms
    moves it by about e (|r - 1/r| + q), which is small for close values. Otherwise the dot
    product is summed, of the values divided by their largest moduli (no product overflows).
    """
    if size_a.peak == 0.0 and size_b.peak == 0.0:
        return 1.0
    if size_a.peak == 0.0 or size_b.peak == 0.0:
        return 0.0
    r = size_a.ratio(size_b)
    if abs(r - 1 / r) + q <= _NORMS_CLOSE:
        cosine = (r + 1 / r - q) / 2
    else:
        dot = torch.sum((x / size_a.peak) * (y / size_b.peak).conj()).real
        cosine = float(dot) / (size_a.spread * size_b.spread)
    return max(-1.0, min(1.0, cosine))
