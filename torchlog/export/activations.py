"""Saved activations as exporters summarise them: which passes, and their statistics.

The statistics themselves are `torchlog.statistics`, the one definition every front end
uses (the viewer's panel, TensorBoard's scalars and histograms, Netron's metrics).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from torchlog.errors import InvalidOptionError
from torchlog.statistics import TensorStats, summarize_all

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["activation_stats", "require_saved"]


def activation_stats(history: "ModelHistory") -> dict[str, TensorStats]:
    """Statistics of each pass's saved activation that exporters summarise, by pass label.

    Left out: the output passes (they repeat their producer), empty tensors and values that
    are not tensors (an `activation_postfunc` result). A value shared by passes is
    summarised once.

    Example:
        >>> import torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.ReLU(), torch.tensor([-1.0, 3.0]))
        >>> stats = activation_stats(h)
        >>> list(stats), stats['relu_1_1'].mean, stats['relu_1_1'].std
        (['input_1_0', 'relu_1_1'], 1.5, 1.5)
    """
    labels: dict[str, int] = {}
    values: dict[int, torch.Tensor] = {}
    for record in history:
        if record.is_output or record.saved is None:
            continue
        key = id(record.saved)
        if key not in values:
            value = record.tensor_contents
            if not isinstance(value, torch.Tensor) or value.numel() == 0:
                continue
            values[key] = value
        labels[record.label] = key
    found = dict(zip(values, summarize_all(values.values())))
    return {label: found[key] for label, key in labels.items()}


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
