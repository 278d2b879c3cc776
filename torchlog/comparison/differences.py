"""How far apart two values of one pass are: max absolute and relative difference, relative L2, cosine."""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from torchlog.comparison.tolerances import Tolerance

__all__ = ["Difference", "Reference", "difference", "working_dtype", "SAME"]


class Difference(NamedTuple):
    """How `b` differs from `a`, computed in the wider of their dtypes.

    Differences are taken where both values are finite; NaN and Inf must sit at the same
    places with the same sign, or every figure is inf (cosine NaN).
    """

    max_abs: float  # max |a - b|
    max_rel: float  # max |a - b| / max |a|: the largest difference next to the size of a
    rel_l2: float  # ||a - b|| / ||a||
    cosine: float  # <a, b> / (||a|| ||b||); 1.0 when both are all zeros

    def within(self, tolerance: Tolerance) -> bool:
        """Whether max |a - b| <= atol + rtol * max |a|."""
        if self.max_abs == 0.0:
            return True
        scale = self.max_abs / self.max_rel  # max |a|: 0.0 where max_rel is inf
        return self.max_abs <= tolerance.atol + tolerance.rtol * scale


SAME = Difference(0.0, 0.0, 0.0, 1.0)
_APART = Difference(math.inf, math.inf, math.inf, math.nan)


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

    __slots__ = ("value", "_work", "_figures")

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value.detach()
        self._work: tuple[torch.dtype, torch.Tensor] | None = None
        self._figures: tuple[float, float] | None = None  # (max |a|, ||a||) in that dtype

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
        found, self._figures = _figures(x, y, self._figures)
        return found if found is not None else _nonfinite_figures(x, y)


def working_dtype(first: torch.dtype, second: torch.dtype) -> torch.dtype:
    """float32 for values of at most 32-bit floats, float64 (complex128) for wider or
    integer values, complex64 for complex values of at most 64 bits."""
    wide = any(d.itemsize > 4 if d.is_floating_point else d.itemsize > 8 if d.is_complex else True
               for d in (first, second))
    if first.is_complex or second.is_complex:
        return torch.complex128 if wide else torch.complex64
    return torch.float64 if wide else torch.float32


def _figures(x: torch.Tensor, y: torch.Tensor, known: tuple[float, float] | None
             ) -> tuple[Difference | None, tuple[float, float] | None]:
    """The figures of two tensors (None when a NaN or Inf made them meaningless), and
    `x`'s largest size and norm, worked out unless `known` gives them.

    The reductions are read back at once (one device sync): the extremes of the
    difference and of `x` (aminmax is several times faster than an inf-norm on CPU) and
    the L2 norms; the dot product comes from them, as ||a - b||^2 = ||a||^2 + ||b||^2 - 2 <a, b>.
    """
    diff = x - y
    parts = [*_extremes(diff), torch.linalg.vector_norm(diff), torch.linalg.vector_norm(y)]
    if known is None:
        parts += [*_extremes(x), torch.linalg.vector_norm(x)]
    read = torch.stack(parts).tolist()  # one real dtype: float32 or float64, read exactly
    low, high, norm_diff, norm_b = read[:4]
    if known is None:
        known = (max(-read[4], read[5]), read[6])
    max_abs, (scale, norm_a) = max(-low, high), known
    if not all(math.isfinite(v) for v in (max_abs, scale, norm_diff, norm_a, norm_b)):
        return None, known
    if max_abs == 0.0:  # equal values (-0.0 and 0.0, or of two dtypes): cosine exactly 1
        return SAME, known
    dot = (norm_a * norm_a + norm_b * norm_b - norm_diff * norm_diff) / 2
    return Difference(max_abs, _ratio(max_abs, scale), _ratio(norm_diff, norm_a),
                      _cosine(dot, norm_a, norm_b)), known


def _extremes(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The least and greatest of a real tensor; 0 and the largest modulus of a complex one."""
    if not t.is_complex():
        return torch.aminmax(t)
    size = t.abs()
    return torch.zeros((), dtype=size.dtype, device=size.device), size.max()


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
    return found if found is not None else _APART  # finite values whose difference overflows


def _ratio(part: float, whole: float) -> float:
    if part == 0.0:
        return 0.0
    return part / whole if whole > 0.0 else math.inf


def _cosine(dot: float, norm_a: float, norm_b: float) -> float:
    if norm_a == 0.0 and norm_b == 0.0:
        return 1.0
    if norm_a == 0.0 or norm_b == 0.0:
        return 0.0
    return max(-1.0, min(1.0, dot / (norm_a * norm_b)))
