"""Where a NaN or Inf first appears: the first pass holding one, whose parents hold none."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from torchlog.api import log_forward_pass
from torchlog.capture.plan import Firing
from torchlog.errors import InterventionError, InvalidArgumentTypeError
from torchlog.history import ModelHistory
from torchlog.records import PassRecord
from torchlog.select import OpView, where
from torchlog.seeding import new_seed

__all__ = ["find_nonfinite", "first_nonfinite", "has_nonfinite"]


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


class _Found(Exception):
    """Raised by the watch on the first op whose output is not finite: ends the first pass."""

    def __init__(self, op_index: int) -> None:
        super().__init__(f"op {op_index} returned a NaN or Inf")
        self.op_index = op_index


def _watch(value: torch.Tensor, firing: Firing) -> torch.Tensor:
    if has_nonfinite(value):
        raise _Found(firing.op_index)
    return value  # unchanged: the watch only looks


def find_nonfinite(model: nn.Module, input_args: Any, input_kwargs: dict[str, Any] | None = None,
                   *, random_seed: int | None = None) -> PassRecord | None:
    """Run `model` until an op returns a NaN or Inf, and return that pass with its call site.

    Two runs from one seed. The first saves nothing and looks at each op's output as it
    returns (a `torchlog.interventions` callable that leaves it unchanged), and ends the
    pass at the first one holding a NaN or Inf: it never runs past it. The second is
    logged with `stop_after` at that op, saving every value up to it and none after
    (`stop_after` first finds the op's position in a pass that saves nothing and, like
    any label site, runs the whole model). The result is `first_nonfinite` of that
    history: the op, or an input or buffer that held a NaN already.

    Args:
        model: as for `log_forward_pass`.
        input_args: as for `log_forward_pass`.
        input_kwargs: as for `log_forward_pass`.
        random_seed: the seed of both runs (drawn when None).

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
    seed = new_seed() if random_seed is None else random_seed
    try:
        log_forward_pass(model, input_args, input_kwargs, layers_to_save=None, random_seed=seed,
                         intervene={where(_any_op): _watch})
    except InterventionError as exc:
        found = exc.__cause__
        if isinstance(found, _Found):
            history = log_forward_pass(model, input_args, input_kwargs, random_seed=seed,
                                       stop_after=found.op_index)
            return first_nonfinite(history)
        if getattr(exc, "torchlog_history", None) is None or exc.torchlog_history.is_partial:
            raise
        return None  # a pass with no op: the watch never fired
    return None


def _any_op(op: OpView) -> bool:
    return True
