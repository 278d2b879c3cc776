"""Numbers a caller gives per op, for the page to colour its nodes by (with a legend).

Compare and patching tools colour nodes by a difference or an effect through this: they pass
`colour_by={'linear_1_1': 0.02, 'relu_1_2': 0.4, ...}` and a legend title to `to_html`,
`page_html` or `show`. The page's colour control then offers that scale beside the
statistics of the saved activations (std, share of zeros, NaN/Inf count, max |x|).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from numbers import Real
from typing import TYPE_CHECKING, Any

from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError
from torchlog.records import LayerRecord

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["colour_data", "pass_labels"]

DEFAULT_LEGEND = "value"


def colour_data(history: "ModelHistory", colour_by: Mapping[str, float] | None,
                legend: str | None) -> dict[str, Any] | None:
    """The page's form of `colour_by`: `{'title': legend, 'values': {pass label: number}}`.

    A key is anything `history[key]` accepts: a pass label (`linear_1_1:2`) colours that
    pass, a layer label (`linear_1_1`) every pass of the layer; a later key wins over an
    earlier one for the same pass. None stays None.

    Raises:
        InvalidArgumentTypeError: `colour_by` is not a mapping, a key is not a str, a value
            not a real number, or `legend` not a str.
        InvalidOptionError: a value is NaN or infinite.
        LayerNotFoundError: a key names nothing in the history (the closest labels listed).

    Example:
        >>> import torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.Linear(3, 2), torch.ones(1, 3))
        >>> colour_data(h, {'linear_1_1': 0.5}, 'rel. diff')
        {'title': 'rel. diff', 'values': {'linear_1_1': 0.5}}
    """
    if colour_by is None:
        return None
    if not isinstance(colour_by, Mapping):
        raise InvalidArgumentTypeError(
            f"colour_by must map labels to numbers ({{'linear_1_1': 0.5}}), got "
            f"{type(colour_by).__name__}: {colour_by!r:.80}")
    if legend is not None and not isinstance(legend, str):
        raise InvalidArgumentTypeError(f"colour_legend must be a str, got {legend!r}")
    values: dict[str, float] = {}
    for key, value in colour_by.items():
        if not isinstance(key, str):
            raise InvalidArgumentTypeError(
                f"colour_by keys are labels (str), got {key!r} of type {type(key).__name__}")
        if isinstance(value, bool) or not isinstance(value, Real):
            raise InvalidArgumentTypeError(
                f"colour_by[{key!r}] must be a real number, got {value!r} of type {type(value).__name__}")
        if not math.isfinite(value):
            raise InvalidOptionError(f"colour_by[{key!r}] is {value!r}; give finite numbers "
                                     "(leave a label out to show it has no value)")
        for label in pass_labels(history, key):
            values[label] = float(value)
    return {"title": legend or DEFAULT_LEGEND, "values": values}


def pass_labels(history: "ModelHistory", key: str) -> list[str]:
    """The passes a key of `colour_by` or `Annotations` stands for: a pass label that pass, a
    layer label each pass of the layer.

    Raises:
        LayerNotFoundError: the key names nothing in the history (the closest labels listed).
    """
    found = history[key]
    return [r.label for r in found.passes] if isinstance(found, LayerRecord) else [found.label]
