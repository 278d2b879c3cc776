"""Resolving `layers_to_save` entries (labels, modules, positions, substrings) to passes."""
from __future__ import annotations

from collections.abc import Sequence

from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError, closest_matches
from torchlog.history import ModelHistory
from torchlog.records import LayerRecord, NodeKind, PassRecord
from torchlog.select import Selector

_OP_KINDS = (NodeKind.OP, NodeKind.CREATED)

__all__ = ["SELECTION_FORMS", "call_positions", "check_entries", "resolve"]

SELECTION_FORMS = (
    "'all', None, or a list mixing layer labels ('conv2d_3_7', 'linear_1_1:2'), module "
    "addresses ('features'), int positions (-5), substrings of labels ('conv') and "
    "torchlog.select selectors (select.func('relu') & select.in_module('features'))"
)


def check_entries(layers_to_save: object) -> list[int | str] | None:
    """Validate the shape of `layers_to_save` before any forward pass.

    Returns None for 'all', an empty list for None (save nothing), else the entries.

    Raises:
        InvalidArgumentTypeError: not a str, int, list or tuple, or an entry of another type.
        InvalidOptionError: an empty list.
    """
    if isinstance(layers_to_save, str) and layers_to_save == "all":
        return None
    if layers_to_save is None:
        return []
    if isinstance(layers_to_save, (str, int, Selector)) and not isinstance(layers_to_save, bool):
        layers_to_save = [layers_to_save]
    if not isinstance(layers_to_save, (list, tuple)):
        raise InvalidArgumentTypeError(
            f"layers_to_save={layers_to_save!r} is not accepted; use {SELECTION_FORMS}")
    if not layers_to_save:
        raise InvalidOptionError(
            "layers_to_save=[] selects nothing; pass None to save no activations or "
            f"use {SELECTION_FORMS}")
    for entry in layers_to_save:
        if isinstance(entry, Selector):
            continue
        if isinstance(entry, bool) or not isinstance(entry, (str, int)):
            raise InvalidArgumentTypeError(
                f"layers_to_save entry {entry!r} ({type(entry).__name__}) is not accepted; "
                f"entries are str or int: {SELECTION_FORMS}")
        if isinstance(entry, str) and not entry:
            raise InvalidOptionError(f"layers_to_save entry {entry!r} is empty; {SELECTION_FORMS}")
    return list(layers_to_save)


def resolve(history: ModelHistory, entries: Sequence[int | str]) -> set[int]:
    """Return the op indexes of every pass the entries select in a full history.

    Raises:
        InvalidOptionError: an entry matches nothing; the message lists close labels.
    """
    chosen: set[int] = set()
    for entry in entries:
        found = _resolve_one(history, entry)
        if not found:
            near = closest_matches(str(entry), history.layer_labels + list(history.modules))
            hint = f"; closest: {', '.join(near)}" if near else ""
            raise InvalidOptionError(
                f"layers_to_save entry {entry!r} matches no layer, module or position of this "
                f"model ({len(history)} layers){hint}; use {SELECTION_FORMS}")
        chosen |= found
    return chosen


def call_positions(passes: Sequence[PassRecord]) -> dict[int, tuple[int, int]]:
    """(call number, output index) of every op pass, by op index: how capture numbers the
    calls that made them (`RawNode.call_id`, the lean capture's count), so that a pass found
    in one run can be acted on in another that runs the same ops.

    Example:
        >>> import torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()), torch.ones(1, 2))
        >>> call_positions(h.passes)
        {1: (1, 0), 2: (2, 0)}
    """
    found: dict[int, tuple[int, int]] = {}
    count = 0
    for record in passes:
        if record.kind not in _OP_KINDS or "view_written_by" in record.extra:
            continue  # inputs, outputs, buffers; a view's value after a write (no call of its own)
        if record.output_index == 0:
            count += 1
        found[record.op_index] = (count, record.output_index)
    return found


def _resolve_one(history: ModelHistory, entry: int | str | Selector) -> set[int]:
    if isinstance(entry, Selector):
        return entry.passes_in(history)
    if isinstance(entry, int):
        return {history[entry].op_index} if entry in history else set()
    found: set[int] = set()
    module = history.modules.get(entry)
    if module is not None:
        for call in module.call_outputs:
            found |= {history[label].op_index for label in call}
    elif entry in history:
        target = history[entry]
        passes = target.passes if isinstance(target, LayerRecord) else (target,)
        found |= {p.op_index for p in passes if isinstance(p, PassRecord)}
    if not found:
        found = {p.op_index for p in history if entry in p.label}
    return found
