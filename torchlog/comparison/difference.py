"""How far apart two values of one pass are: max absolute and relative difference, relative L2, cosine."""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from torchlog.comparison.tolerances import Tolerance

__all__ = ["Difference", "difference", "SAME"]


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
    if a.shape != b.shape:
        raise ValueError(f"values of shape {tuple(a.shape)} and {tuple(b.shape)} cannot be compared")
    a, b = a.detach(), b.detach().to(a.device)
    # torch.equal stops at the first unequal element: cheap for values that differ.
    if a.numel() == 0 or (a.dtype == b.dtype and torch.equal(a, b)):  # NaN never equals NaN here
        return SAME
    work = _working_dtype(a.dtype, b.dtype)
    x, y = a.to(work), b.to(work)  # any layout: no reduction below needs a flat copy
    found = _figures(x, y)
    return found if found is not None else _nonfinite_figures(x, y)


def _working_dtype(first: torch.dtype, second: torch.dtype) -> torch.dtype:
    """float32 for values of at most 32-bit floats, float64 (complex128) for wider or
    integer values, complex64 for complex values of at most 64 bits."""
    wide = any(d.itemsize > 4 if d.is_floating_point else d.itemsize > 8 if d.is_complex else True
               for d in (first, second))
    if first.is_complex or second.is_complex:
        return torch.complex128 if wide else torch.complex64
    return torch.float64 if wide else torch.float32


def _figures(x: torch.Tensor, y: torch.Tensor) -> Difference | None:
    """The figures of two tensors; None when a NaN or Inf made them meaningless.

    Five reductions, read back at once (one device sync): min and max of the difference
    and of `x` (aminmax is several times faster than an inf-norm on CPU), and three L2
    norms; the dot product comes from them, as ||a - b||^2 = ||a||^2 + ||b||^2 - 2 <a, b>.
    """
    diff = x - y
    if diff.is_complex():
        diff, size = diff.abs(), x.abs()
        low, high = torch.zeros((), dtype=diff.dtype), diff.max()
        low_a, high_a = torch.zeros((), dtype=size.dtype), size.max()
    else:
        (low, high), (low_a, high_a) = torch.aminmax(diff), torch.aminmax(x)
    norms = [torch.linalg.vector_norm(t).to(low.dtype) for t in (diff, x, y)]
    low, high, low_a, high_a, norm_diff, norm_a, norm_b = \
        torch.stack([low, high, low_a, high_a, *norms]).double().tolist()
    max_abs, scale = max(-low, high), max(-low_a, high_a)
    if not all(math.isfinite(v) for v in (max_abs, scale, norm_diff, norm_a, norm_b)):
        return None
    if max_abs == 0.0:  # equal values (-0.0 and 0.0, or of two dtypes): cosine exactly 1
        return SAME
    dot = (norm_a * norm_a + norm_b * norm_b - norm_diff * norm_diff) / 2
    return Difference(max_abs, _ratio(max_abs, scale), _ratio(norm_diff, norm_a),
                      _cosine(dot, norm_a, norm_b))


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
    found = _figures(x[keep], y[keep])
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
