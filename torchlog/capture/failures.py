"""What capture notes about a torch call that raised: its tensor arguments, as plain data."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torchlog.capture.nesting import find_tensors

__all__ = ["failed_args"]


def failed_args(args: tuple, kwargs: dict, parents: list, node_of: Callable[[torch.Tensor], int | None],
                param_of: Callable[[torch.Tensor], str | None]) -> tuple[tuple, ...]:
    """(slot, shape, dtype, node, parameter address) of each tensor argument of a failed call.

    Runs only when an op raised, never per op. `slot` is written as `ParentEdge.arg` is (2,
    'other', (0, 1)); `parents` are the (node, slot) pairs found before the call, which name
    the node holding each argument's value as the op read it; `node_of` answers for tensors
    found elsewhere (inside a dataclass), `param_of` names parameters. A tensor whose shape
    cannot be read (a nested tensor) gets the shape None.
    """
    by_slot = {slot: node for node, slot in parents}
    found = []
    for values in (args, kwargs):
        for t, path in find_tensors(values):
            slot = path[0] if len(path) == 1 else path
            node = by_slot.get(slot)
            if node is None:
                node = node_of(t)
            found.append((slot, _shape(t), t.dtype, node, param_of(t) if node is None else None))
    return tuple(found)


def _shape(t: torch.Tensor) -> tuple[int, ...] | None:
    try:
        return tuple(t.shape)
    except (RuntimeError, NotImplementedError):  # a nested or sizeless wrapper tensor
        return None
