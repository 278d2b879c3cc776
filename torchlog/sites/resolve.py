"""Finding the passes a site names in a finished history, and which of them an action can reach."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchlog.errors import InterventionError, InvalidOptionError, closest_matches
from torchlog.history import ModelHistory
from torchlog.records import LayerRecord, NodeKind, PassRecord
from torchlog.sites.entries import SELECTION_FORMS
from torchlog.sites.select import Selector, ModuleSelector, ModuleTypeSelector

_OP_KINDS = (NodeKind.OP, NodeKind.CREATED)

__all__ = ["acted_on", "call_positions", "exit_part", "module_selector", "parts", "resolve"]


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


def acted_on(passes: list[PassRecord], index: int, given: Any) -> PassRecord:
    """The op pass an action on pass `index` changes: itself, or for an output of the model
    the op that made it.

    Raises:
        InterventionError: an input, buffer or other tensor no op made, or a view's value
            after an in-place write (name the write instead).
    """
    record = passes[index]
    if record.kind == NodeKind.OUTPUT:
        parent = record.parents[0].label
        record = next(p for p in passes if p.label == parent)
    if record.kind in (NodeKind.OP, NodeKind.CREATED) and "view_written_by" not in record.extra:
        return record
    why = ("is a view's value after an in-place write into its base; name the op that wrote it"
           if "view_written_by" in record.extra else
           f"is a {record.kind.value} tensor, which no op of the model made; pass the edited "
           "tensor as input (or edit the model's state) instead")
    raise InterventionError(f"site {given!r} names pass {record.label!r}, which {why}")


def parts(selector: Selector) -> list[Selector]:
    found, pending = [], [selector]
    while pending:
        item = pending.pop()
        found.append(item)
        pending += [getattr(item, name) for name in ("left", "right", "inner") if hasattr(item, name)]
    return found


def exit_part(selector: Selector) -> Selector:
    return next(p for p in parts(selector) if isinstance(p, (ModuleSelector, ModuleTypeSelector)))


def module_selector(given: Any, addresses: Any) -> Selector | None:
    """`select.module(...)` for a str naming a module of `addresses` ('h.0') or one call of
    it ('cell:3'), else None: how every consumer reads a module address."""
    if not isinstance(given, str):
        return None
    if given in addresses:
        return ModuleSelector(given)
    address, _, call = given.rpartition(":")
    if address in addresses and call.isdigit() and int(call) >= 1:
        return ModuleSelector(address, int(call))
    return None
