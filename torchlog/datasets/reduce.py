"""Which dimensions of a site's value are pooled into samples, and which are kept as features."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError

__all__ = ["REDUCE_FORMS", "Reduce", "as_reduce", "keep"]

REDUCE_FORMS = ("'batch' (pool the first dimension), 'tokens' (pool every dimension but the last: "
                "batch and sequence), 'all' (pool everything), an int or tuple of ints (the dimensions "
                "pooled), or torchlog.datasets.keep(1) (pool every dimension but 1, such as a CNN's channels)")


@dataclass(frozen=True, slots=True)
class Reduce:
    """The dimensions pooled: `pooled` names them, or `kept` names the others (negative
    counts from the end); `name` is how the user wrote it, for messages."""

    pooled: tuple[int, ...] | None  # the dimensions pooled, when given that way
    kept: tuple[int, ...] | None  # the dimensions kept as features, when given that way
    name: str  # the spelling the user gave

    def split(self, ndim: int, site: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(pooled, kept) dimensions of a value with `ndim` dimensions, each ascending and
        non-negative.

        Raises:
            InvalidOptionError: a dimension out of range for `ndim` (naming the site and the
                value's number of dimensions), or a dimension named twice.
        """
        given = self.pooled if self.pooled is not None else self.kept
        if given is None:  # 'all'
            return tuple(range(ndim)), ()
        dims = []
        for dim in given:
            if not -ndim <= dim < ndim:
                raise InvalidOptionError(
                    f"reduce={self.name} names dimension {dim}, but site {site!r} gives values with "
                    f"{ndim} dimensions (valid: {-ndim} to {ndim - 1}); use {REDUCE_FORMS}")
            dims.append(dim % ndim)
        if len(set(dims)) != len(dims):
            raise InvalidOptionError(f"reduce={self.name} names a dimension twice for site {site!r} "
                                     f"({ndim} dimensions)")
        chosen = tuple(sorted(dims))
        others = tuple(d for d in range(ndim) if d not in chosen)
        return (chosen, others) if self.pooled is not None else (others, chosen)


def keep(*dims: int) -> Reduce:
    """Pool every dimension but `dims` (the features kept), e.g. `keep(1)` for a CNN's channels.

    Raises:
        InvalidArgumentTypeError: a dimension that is not an int, or none given.

    Example:
        >>> keep(1).split(4, "conv")
        ((0, 2, 3), (1,))
    """
    if not dims or any(isinstance(d, bool) or not isinstance(d, int) for d in dims):
        raise InvalidArgumentTypeError(f"keep(...) takes one or more int dimensions, got {dims!r}")
    return Reduce(None, tuple(dims), f"keep{dims!r}".replace(",)", ")"))


def as_reduce(value: Any) -> Reduce:
    """The Reduce `value` stands for: see REDUCE_FORMS.

    Raises:
        InvalidArgumentTypeError: any other value, named with the forms accepted.

    Example:
        >>> as_reduce('tokens').split(3, 'h.0')
        ((0, 1), (2,))
    """
    if isinstance(value, Reduce):
        return value
    if value == "batch":
        return Reduce((0,), None, "'batch'")
    if value == "tokens":
        return Reduce(None, (-1,), "'tokens'")
    if value == "all":
        return Reduce(None, None, "'all'")
    if isinstance(value, int) and not isinstance(value, bool):
        return Reduce((value,), None, repr(value))
    if (isinstance(value, Sequence) and not isinstance(value, str) and value
            and all(isinstance(d, int) and not isinstance(d, bool) for d in value)):
        return Reduce(tuple(value), None, repr(tuple(value)))
    raise InvalidArgumentTypeError(f"reduce={value!r} is not accepted; use {REDUCE_FORMS}")


def to_rows(value: torch.Tensor, pooled: tuple[int, ...], kept: tuple[int, ...]) -> torch.Tensor:
    """`value` as a float64 matrix: one row per sample (the pooled dimensions), one column
    per feature (the kept dimensions, flattened in order)."""
    num_features = 1
    for dim in kept:
        num_features *= value.shape[dim]
    rows = value.permute(*pooled, *kept).reshape(-1, num_features)
    return rows.to(torch.float64)
