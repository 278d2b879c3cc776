"""Where a NaN or Inf first appears: the first pass holding one, whose parents hold none."""
from __future__ import annotations

from typing import Any

import torch

from torchlog.errors import InvalidArgumentTypeError
from torchlog.history import ModelHistory
from torchlog.records import PassRecord

__all__ = ["first_nonfinite", "has_nonfinite"]


def first_nonfinite(history: ModelHistory) -> PassRecord | None:
    """The first pass, in execution order, whose value holds a NaN or Inf while its
    parents' values are finite; None when there is none.

    Parents run before their children, so the first pass holding one is that pass,
    unless a parent's value was not saved (then it cannot be checked, and counts as
    finite). Values are read one at a time: a history opened from a file stays on disk.

    Raises:
        InvalidArgumentTypeError: `history` is not a ModelHistory.

    Example:
        >>> import torch, torchlog
        >>> class Net(torch.nn.Module):
        ...     def forward(self, x):
        ...         return (x - 1).log().exp()
        >>> history = torchlog.log_forward_pass(Net(), torch.zeros(2))
        >>> history.first_nonfinite().label
        'log_1_2'
    """
    if not isinstance(history, ModelHistory):
        raise InvalidArgumentTypeError(f"first_nonfinite() takes a ModelHistory, got {history!r} "
                                       f"of type {type(history).__name__}")
    return next((record for record in history if has_nonfinite(record.tensor_contents)), None)


def has_nonfinite(value: Any) -> bool:
    """Whether `value` is a float or complex tensor holding a NaN or Inf."""
    if not isinstance(value, torch.Tensor) or not (value.is_floating_point() or value.is_complex()):
        return False
    return not bool(torch.isfinite(value).all())
