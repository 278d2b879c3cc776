"""How close two values must be to match: defaults per dtype, and the working precision of a pass."""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

import torch

from torchlog.errors import InvalidOptionError
from torchlog.records import PassRecord

__all__ = ["Tolerance", "check_tolerance", "default_tolerance", "precision_of", "working_precision"]

# (rtol, atol) for the common float dtypes; other floats (float8) get 2 eps. Key: machine eps.
_DEFAULTS = {
    torch.finfo(torch.float64).eps: (1e-10, 1e-12),
    torch.finfo(torch.float32).eps: (1e-5, 1e-7),
    torch.finfo(torch.float16).eps: (1e-2, 1e-4),
    torch.finfo(torch.bfloat16).eps: (1e-2, 1e-4),
}


class Tolerance(NamedTuple):
    """Two values match when max |a - b| <= atol + rtol * max |a| (see `Difference`)."""

    rtol: float
    atol: float


def precision_of(dtype: torch.dtype) -> float:
    """The machine epsilon of a float or complex dtype; 0.0 (exact) for integers and bool."""
    if dtype.is_floating_point or dtype.is_complex:
        return torch.finfo(dtype).eps
    return 0.0


def default_tolerance(precision: float) -> Tolerance:
    """The default tolerance for values worked out at `precision` (a machine epsilon).

    Example:
        >>> default_tolerance(precision_of(torch.bfloat16))
        Tolerance(rtol=0.01, atol=0.0001)
    """
    if precision == 0.0:
        return Tolerance(0.0, 0.0)
    rtol, atol = _DEFAULTS.get(precision, (2 * precision, 2 * precision / 100))
    return Tolerance(rtol, atol)


def working_precision(passes: Iterable[PassRecord]) -> dict[str, float]:
    """Per pass label, the coarsest precision of its own dtype and of every value it was
    computed from (its parents' working precision): a float32 sum of bfloat16 values is
    no more precise than bfloat16. Passes must come in execution order."""
    found: dict[str, float] = {}
    for record in passes:
        coarsest = precision_of(record.dtype)
        for label in record.parent_labels:
            coarsest = max(coarsest, found.get(label, 0.0))
        found[record.label] = coarsest
    return found


def check_tolerance(name: str, value: float | None) -> float | None:
    """`value` as a float, or None when not given.

    Raises:
        InvalidOptionError: `value` is not a finite number >= 0 (a bool counts as none).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0:
        raise InvalidOptionError(f"{name} must be a finite number >= 0 (or None for the defaults "
                                 f"of each pair's dtype), got {value!r}")
    return float(value)
