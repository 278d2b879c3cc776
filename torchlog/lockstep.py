"""Lockstep closure: a union-find over ops in which joining two ops joins their same-place neighbours.

When two ops are passes of one layer, the ops sitting in the same place next to them
(same direction, same program point, same argument slot) are passes of one layer too:
the body of a loop folds along with any layer in it. `LockstepUnion` computes the
smallest partition that contains the seeds it is given and is closed under that rule.
The result does not depend on the order seeds are added in, and a group is only ever
joined, never split, so ops seeded together always end in one layer.

Each component keeps a table from neighbour position to one neighbour; joining two
components compares their tables and queues a join for every position both have. The
smaller table is merged into the larger, so the whole closure costs about one visit per
edge (times a logarithmic factor at worst).
"""
from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchlog.capture.nodes import RawNode

_PARENT, _CHILD = 0, 1
NOT_AN_OP = -1  # program point id of inputs, outputs, buffers and foreign tensors

# (direction, neighbour's program point id, argument slot, n-th neighbour with these three)
Position = tuple[int, int, Hashable, int]


class LockstepUnion:
    """Partition of node indexes into layers, closed under lockstep neighbours.

    Args:
        nodes: the raw nodes of one forward pass, indexed by position.
        points: per node, the id of its program point, or `NOT_AN_OP`. Only nodes
            with equal ids are ever joined, so every layer is one program point.
    """

    def __init__(self, nodes: Sequence[RawNode], points: Sequence[int]) -> None:
        self.nodes = nodes
        self.points = points
        self._root = list(range(len(nodes)))
        self._size = [1] * len(nodes)
        self._tables: dict[int, dict[Position, int]] = {}  # only for components of 2+

    def find(self, index: int) -> int:
        """The representative of `index`'s component."""
        root = self._root
        while root[index] != index:
            root[index] = root[root[index]]  # path halving
            index = root[index]
        return index

    def is_joined(self, members: Sequence[int]) -> bool:
        """Whether all of `members` are already in one component."""
        first = self.find(members[0])
        return all(self.find(m) == first for m in members)

    def join_all(self, members: Sequence[int]) -> None:
        """Put `members` (all of one program point) in one layer, with everything that follows."""
        for other in members[1:]:
            self.join(members[0], other)

    def join(self, a: int, b: int) -> None:
        """Join the components of `a` and `b` and, transitively, their same-place neighbours."""
        pending = [(a, b)]
        while pending:
            a, b = pending.pop()
            big, small = self.find(a), self.find(b)
            if big == small:
                continue
            if self._size[big] < self._size[small]:
                big, small = small, big
            self._root[small] = big
            self._size[big] += self._size[small]
            table = self._table(big)
            for position, neighbour in self._take_table(small).items():
                known = table.setdefault(position, neighbour)
                if known != neighbour:
                    pending.append((known, neighbour))

    def components(self) -> list[list[int]]:
        """Every component as a sorted list of node indexes, ordered by first member."""
        by_root: dict[int, list[int]] = {}
        for index in range(len(self.nodes)):
            by_root.setdefault(self.find(index), []).append(index)
        return list(by_root.values())

    def _table(self, root: int) -> dict[Position, int]:
        table = self._tables.get(root)
        if table is None:
            table = self._tables[root] = self._positions(root)
        return table

    def _take_table(self, root: int) -> dict[Position, int]:
        table = self._tables.pop(root, None)
        return self._positions(root) if table is None else table

    def _positions(self, index: int) -> dict[Position, int]:
        """Where each op neighbour of one node sits relative to it."""
        points = self.points
        node = self.nodes[index]
        table: dict[Position, int] = {}
        seen: dict[tuple, int] = {}
        for parent, slot in node.parents:
            if points[parent] != NOT_AN_OP:
                base = (_PARENT, points[parent], slot)
                nth = seen[base] = seen.get(base, -1) + 1
                table.setdefault(base + (nth,), parent)
        for child in node.children:
            if points[child] != NOT_AN_OP:
                slot = next(s for p, s in self.nodes[child].parents if p == index)
                base = (_CHILD, points[child], slot)
                nth = seen[base] = seen.get(base, -1) + 1
                table.setdefault(base + (nth,), child)
        return table
