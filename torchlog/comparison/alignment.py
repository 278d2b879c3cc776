"""Pairing the passes of two runs: by label when both ran the same ops, else in execution order."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from difflib import SequenceMatcher
from typing import Any, NamedTuple

from torchlog.records import PassRecord

__all__ = ["Pair", "align"]


class Pair(NamedTuple):
    """A pass of run a and its partner in run b; None on the side that has no partner."""

    a: PassRecord | None
    b: PassRecord | None


def align(a: Sequence[PassRecord], b: Sequence[PassRecord]) -> tuple[list[Pair], str]:
    """Pair the passes of two runs, in run a's execution order.

    When both ran the same functions under the same labels, each pass pairs with b's pass
    of that label ('label'). Otherwise ('sequence') the passes pair in execution order on
    (module address, function, output shape); a stretch left unpaired is paired again on
    (function, output shape) alone, so renamed modules still pair. A pass that pairs with
    nothing comes as (pass, None) or (None, pass) where it ran, b's after a's.

    Returns:
        The pairs and how they were found ('label' or 'sequence').

    Example:
        >>> import torch, torchlog
        >>> x = torch.randn(2, 3)
        >>> a = torchlog.log_forward_pass(torch.nn.Sequential(torch.nn.ReLU()), x)
        >>> b = torchlog.log_forward_pass(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh()), x)
        >>> pairs, how = align(a.passes, b.passes)
        >>> how, [(p.a and p.a.label, p.b and p.b.label) for p in pairs]
        ('sequence', [('input_1_0', 'input_1_0'), ('relu_1_1', 'relu_1_1'), (None, 'tanh_1_2'), ('output_1_2', 'output_1_3')])
    """
    if len(a) == len(b) and all(x.label == y.label and x.func_name == y.func_name
                                for x, y in zip(a, b)):
        return [Pair(x, y) for x, y in zip(a, b)], "label"
    pairs: list[Pair] = []
    _match(a, b, _full_key, pairs, then=_op_key)
    return pairs, "sequence"


def _full_key(record: PassRecord) -> tuple[Any, ...]:
    return record.module, record.func_name, record.shape


def _op_key(record: PassRecord) -> tuple[Any, ...]:
    return record.func_name, record.shape


def _match(a: Sequence[PassRecord], b: Sequence[PassRecord], key: Callable[[PassRecord], Any],
           pairs: list[Pair], then: Callable[[PassRecord], Any] | None) -> None:
    """Append the pairs of the longest common stretches of `a` and `b` by `key`; the gaps
    between them are matched again by `then` when given, else left unpaired."""
    # autojunk off: in a transformer the common keys (an add of the hidden size) are the
    # ones to pair, not noise to skip.
    matcher = SequenceMatcher(None, [key(r) for r in a], [key(r) for r in b], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            pairs.extend(Pair(x, y) for x, y in zip(a[i1:i2], b[j1:j2]))
        elif then is not None and i1 < i2 and j1 < j2:
            _match(a[i1:i2], b[j1:j2], then, pairs, then=None)
        else:
            pairs.extend(Pair(x, None) for x in a[i1:i2])
            pairs.extend(Pair(None, y) for y in b[j1:j2])
