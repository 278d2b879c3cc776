"""Where a difference is born rather than carried: the rows that differ while their parents match."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from torchlog.comparison.rows import Row, Status
from torchlog.validation.rules import UNDEFINED_VALUES

__all__ = ["find_origins"]


def find_origins(rows: Sequence[Row], parents_a: Mapping[str, Iterable[str]],
                 parents_b: Mapping[str, Iterable[str]]) -> list[Row]:
    """The paired rows that differ (values or shape) while every paired parent matches.

    `parents_a` and `parents_b` map a label to its parents' labels in each run; a row's
    parents are those of its pass in run a and of its partner in run b. A parent
    that holds uninitialised memory (`empty`) does not count: the op that fills it
    never read it. A row whose local error is known and within tolerance is no origin
    either: its op, run on run a's parents, gives run a's value, so the difference came
    in with parents that matched within tolerance and grew (a softmax of larger logits).

    Returns:
        The origin rows in execution order of run a.
    """
    by_a = {row.label_a: row for row in rows if row.label_a is not None}
    by_b = {row.label_b: row for row in rows if row.label_b is not None}
    found = []
    for row in rows:
        if row.status not in (Status.DIFFERS, Status.SHAPE) or not row.is_paired \
                or row.adds_error is False:
            continue
        linked = [by_a.get(label) for label in parents_a.get(row.label_a, ())]
        linked += [by_b.get(label) for label in parents_b.get(row.label_b, ())]
        if all(_clean(parent) for parent in linked if parent is not None and parent.is_paired):
            found.append(row)
    return found


def _clean(parent: Row) -> bool:
    return parent.status == Status.MATCH or parent.func_name in UNDEFINED_VALUES
