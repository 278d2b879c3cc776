"""Saved activations as exporters need them: a float copy for histograms, and its statistics."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from torchlog.errors import InvalidOptionError
from torchlog.records import PassRecord

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["numeric_values", "activation_stats", "require_saved"]


def numeric_values(record: PassRecord) -> torch.Tensor | None:
    """The saved activation as a detached float64 CPU tensor; None when nothing numeric is saved.

    Complex tensors give their magnitudes; bool and integer tensors their values.
    Empty tensors and values that are not tensors (an `activation_postfunc` result)
    give None.

    Example:
        >>> import torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.ReLU(), torch.tensor([-1.0, 2.0]))
        >>> numeric_values(h['relu_1_1'])
        tensor([0., 2.], dtype=torch.float64)
    """
    value = record.tensor_contents
    if not isinstance(value, torch.Tensor) or value.numel() == 0:
        return None
    value = value.detach()
    if value.is_complex():
        value = value.abs()
    return value.to("cpu", torch.float64)


def activation_stats(values: torch.Tensor) -> dict[str, float]:
    """Mean, std, min, max over the finite values, and how many values are NaN or infinite.

    The std is the population std (`unbiased=False`), 0 for a single value; without
    a finite value, the four statistics are NaN.

    Example:
        >>> activation_stats(torch.tensor([1.0, 3.0, float('nan')], dtype=torch.float64))
        {'mean': 2.0, 'std': 1.0, 'min': 1.0, 'max': 3.0, 'num_nan': 1, 'num_inf': 0}
    """
    finite = values[torch.isfinite(values)]
    nan = float("nan")
    stats = {"mean": nan, "std": nan, "min": nan, "max": nan}
    if finite.numel():
        stats = {"mean": finite.mean().item(), "std": finite.std(unbiased=False).item(),
                 "min": finite.min().item(), "max": finite.max().item()}
    stats["num_nan"] = int(torch.isnan(values).sum())
    stats["num_inf"] = int(torch.isinf(values).sum())
    return stats


def require_saved(history: "ModelHistory", option: str) -> None:
    """Check that `history` holds saved activations before an exporter reads their values.

    Raises:
        InvalidOptionError: no pass of `history` has a saved activation; names `option`.

    Example:
        >>> import torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.ReLU(), torch.ones(2), layers_to_save=None)
        >>> require_saved(h, "include_values=True")
        Traceback (most recent call last):
        ...
        torchlog.errors.InvalidOptionError: include_values=True reads saved activations, but \
the history of ReLU holds none (it was logged with layers_to_save=None); log it again with \
layers_to_save='all' or a list of layers, or leave the option out
    """
    if history.num_saved == 0:
        raise InvalidOptionError(
            f"{option} reads saved activations, but the history of {history.model_name} holds "
            "none (it was logged with layers_to_save=None); log it again with "
            "layers_to_save='all' or a list of layers, or leave the option out")
