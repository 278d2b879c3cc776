"""Which rows add the most error: by local error, or by how much the difference grows over the parents'."""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from torchlog.comparison.rows import Row

__all__ = ["adding_most"]


def adding_most(rows: Sequence[Row], parents_a: Mapping[str, Iterable[str]], n: int) -> list[Row]:
    """The `n` rows that add the most error, most first; rows that add none are left out.

    With local errors (any row has one) a row scores its local error's relative L2: what
    its op adds on its own. Without, it scores how much its relative L2 exceeds the
    largest of its paired parents' in run a (`parents_a`: label -> parent labels), a
    stand-in that counts an op amplifying its inputs' error as adding it.
    """
    if any(row.local is not None for row in rows):
        scores = [(row.local.rel_l2, row) for row in rows if row.local is not None]
    else:
        by_label = {row.label_a: row for row in rows if row.label_a is not None}
        scores = [(_growth(row, by_label, parents_a), row) for row in rows if row.diff is not None]
    ranked = sorted(((s, row) for s, row in scores if s > 0 and not math.isnan(s)),
                    key=lambda item: (-item[0], item[1].position))
    return [row for _, row in ranked[:n]]


def _growth(row: Row, by_label: Mapping[str, Row], parents_a: Mapping[str, Iterable[str]]) -> float:
    assert row.diff is not None and row.label_a is not None
    before = [by_label[label].diff for label in parents_a.get(row.label_a, ()) if label in by_label]
    carried = max((diff.rel_l2 for diff in before if diff is not None), default=0.0)
    if math.isinf(row.diff.rel_l2):
        return math.inf if not math.isinf(carried) else 0.0
    return row.diff.rel_l2 - carried
