"""Which status a pair of passes gets: what makes values comparable, and which ops drew random numbers."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchlog.comparison.differences import Difference, Reference
from torchlog.comparison.rows import Status
from torchlog.comparison.tolerances import Tolerance
from torchlog.records import PassRecord
from torchlog.validation.rules import UNDEFINED_VALUES
from torchlog.sites.random_ops import RANDOM_OPS

__all__ = ["is_undefined", "random_draws", "judge"]


def is_undefined(record: PassRecord) -> bool:
    """Whether the pass is uninitialised memory (`empty`, `new_empty`): no run can reproduce it."""
    return record.func_name in UNDEFINED_VALUES


def random_draws(passes: Sequence[PassRecord]) -> set[str]:
    """Labels of the passes that drew random numbers.

    With recorded RNG states (save_function_args=True) a call drew when the state before
    the next call differs from its own (the outputs of one call share its state);
    otherwise, and for the last call, by the function's name, except an op that gave back
    its input as it was (dropout in eval mode) and a pass whose value an intervention set
    (the other run tells whether the op itself drew).
    """
    calls: list[list[PassRecord]] = []
    for record in passes:
        if record.rng_state is None:
            continue
        if record.output_index == 0 or not calls:
            calls.append([record])
        else:
            calls[-1].append(record)  # a further output of the same call
    drew: set[str] = set()
    for call, after in zip(calls, calls[1:]):
        state, later = call[0].rng_state, after[0].rng_state
        if state is not later and not _same_state(state, later):
            drew.update(record.label for record in call)
    known = {record.label for call in calls[:-1] for record in call}
    by_label = {record.label: record for record in passes}
    drew.update(r.label for r in passes if r.label not in known and r.func_name in RANDOM_OPS
                and not _returned_its_input(r, by_label) and "interventions" not in r.extra)
    return drew


def _returned_its_input(record: PassRecord, by_label: dict[str, PassRecord]) -> bool:
    """Whether the op gave back its first argument's value as it was (dropout in eval mode):
    capture then saves one value for both, and no random number was drawn."""
    if record.saved is None or not record.parents:
        return False
    parent = by_label.get(record.parents[0].label)
    return parent is not None and parent.saved is record.saved


def _same_state(first: Any, second: Any) -> bool:
    if isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor):
        return torch.equal(first, second)
    if isinstance(first, tuple) and isinstance(second, tuple) and len(first) == len(second):
        return all(_same_state(x, y) if isinstance(x, torch.Tensor) else x == y
                   for x, y in zip(first, second))
    return False


def judge(a: PassRecord, b: PassRecord, tolerance: Tolerance,
          random_unmatched: bool) -> tuple[Status, Difference | None, Reference | None]:
    """The status of a paired pass, its difference, and a's value (read once, kept for
    the local error; None when not read or not a tensor).

    `random_unmatched`: the op drew random numbers in runs of different seeds and its
    paired parents all match, so a difference is the draw's, not the runs'.
    """
    if a.shape != b.shape:
        return Status.SHAPE, None, None
    if is_undefined(a) or is_undefined(b):
        return Status.NOT_COMPARABLE, None, None
    if a.saved is None or b.saved is None:
        return Status.NOT_SAVED, None, None
    value_a, value_b = a.tensor_contents, b.tensor_contents  # values are read here, pair by pair
    if not (isinstance(value_a, torch.Tensor) and isinstance(value_b, torch.Tensor)) \
            or value_a.shape != value_b.shape:
        kept = Reference(value_a) if isinstance(value_a, torch.Tensor) else None  # for re-runs
        return Status.NOT_COMPARABLE, None, kept
    reference = Reference(value_a)
    found = reference.difference(value_b)
    if found.within(tolerance):
        return Status.MATCH, found, reference
    return (Status.NOT_COMPARABLE if random_unmatched else Status.DIFFERS), found, reference
