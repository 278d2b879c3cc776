"""Where a NaN or Inf first appears: the first pass holding one, whose parents hold none."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import nn

from torchlog.api import log_prepared
from torchlog.arguments import prepare
from torchlog.capture import UNDEFINED_VALUES, OpPlan
from torchlog.errors import InvalidArgumentTypeError
from torchlog.history import ModelHistory
from torchlog.options import LogOptions
from torchlog.records import PassRecord

__all__ = ["find_nonfinite", "first_nonfinite", "has_nonfinite"]


def first_nonfinite(history: ModelHistory) -> PassRecord | None:
    """The first pass, in execution order, whose value holds a NaN or Inf while its
    parents' values are finite; None when there is none.

    Parents run before their children, so the first pass holding one is that pass,
    unless a parent's value was not saved (then it cannot be checked, and counts as
    finite). `torch.empty` and its kin are skipped: their values are whatever memory held,
    so a NaN there is garbage, not where one came from. Values are read one at a time: a
    history opened from a file stays on disk.

    Raises:
        InvalidArgumentTypeError: `history` is not a ModelHistory.

    Example:
        >>> import torch, torchlog
        >>> class Net(torch.nn.Module):
        ...     def forward(self, x):
        ...         return (x - 1).log().exp()
        >>> from torchlog.comparison import first_nonfinite
        >>> first_nonfinite(torchlog.log_forward_pass(Net(), torch.zeros(2))).label
        'log_1_2'
    """
    if not isinstance(history, ModelHistory):
        raise InvalidArgumentTypeError(f"first_nonfinite() takes a ModelHistory, got {history!r} "
                                       f"of type {type(history).__name__}")
    return next((record for record in history
                 if record.func_name not in UNDEFINED_VALUES and has_nonfinite(record.tensor_contents)), None)


def has_nonfinite(value: Any) -> bool:
    """Whether `value` is a float or complex tensor holding a NaN or Inf."""
    if not isinstance(value, torch.Tensor) or not (value.is_floating_point() or value.is_complex()):
        return False
    return not bool(torch.isfinite(value).all())


def find_nonfinite(model: nn.Module, input_args: Any, input_kwargs: dict[str, Any] | None = None,
                   *, random_seed: int | None = None) -> PassRecord | None:
    """Run `model` until an op returns a NaN or Inf, and return that pass with its call site.

    One logged pass, which looks at each op's output as it is recorded and ends right
    after the first one holding a NaN or Inf: no op after it runs, and values are saved
    up to it, none after. The result is `first_nonfinite` of that history: the op, or an
    input or buffer that held a NaN already. (A NaN written by `t[i] = v`, which returns
    nothing, is seen at the next op that reads `t`.)

    Args:
        model: as for `log_forward_pass`.
        input_args: as for `log_forward_pass`.
        input_kwargs: as for `log_forward_pass`.
        random_seed: the seed of the run (drawn when None).

    Returns:
        The pass (`record.call_site`, `record.module`, `record.tensor_contents`, its parents'
        labels), from a history stopped right after it; None when every op's output is finite.

    Raises:
        TorchlogError: the errors of `log_forward_pass` for bad arguments.
        Exception: whatever the model raises before a NaN appears.

    Example:
        >>> import torch, torchlog
        >>> class Net(torch.nn.Module):
        ...     def forward(self, x):
        ...         return (x - 1).log().exp()
        >>> torchlog.find_nonfinite(Net(), torch.zeros(2)).label
        'log_1_2'
    """
    request = prepare(model, input_args, input_kwargs, LogOptions(random_seed=random_seed))
    request.capture = replace(request.capture, plan=OpPlan(stop_on=has_nonfinite))
    history = log_prepared(request)
    return None if history.stopped_at is None else first_nonfinite(history)
