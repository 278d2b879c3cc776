"""Lockstep closure: a union-find over ops where joining two ops joins their same-place neighbours.

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
    from torchlog.capture import RawNode

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
        """Put `members` in one layer, with everything that follows from it.

        Raises:
            ValueError: `members` are not all ops of one program point.
        """
        points = {self.points[m] for m in members}
        if len(points) != 1 or NOT_AN_OP in points:
            raise ValueError(f"only ops of one program point can be joined; nodes "
                             f"{list(members)!r} have program points {sorted(points)!r}")
        for other in members[1:]:
            self._join(members[0], other)

    def _join(self, a: int, b: int) -> None:
        """Join the components of `a` and `b` and, transitively, their same-place neighbours."""
        find, size, root, tables = self.find, self._size, self._root, self._tables
        pending = [(a, b)]
        while pending:
            a, b = pending.pop()
            big, small = root[a], root[b]
            if root[big] != big:  # most nodes sit one step below their root
                big = find(big)
            if root[small] != small:
                small = find(small)
            if big == small:
                continue
            if size[big] < size[small]:
                big, small = small, big
            root[small] = big
            size[big] += size[small]
            table = tables.get(big)
            if table is None:
                table = tables[big] = dict(self._positions(big))
            smaller = tables.pop(small, None)
            for position, neighbour in (self._positions(small) if smaller is None
                                        else smaller.items()):
                known = table.setdefault(position, neighbour)
                if known != neighbour:
                    pending.append((known, neighbour))

    def components(self) -> list[list[int]]:
        """Every component as a sorted list of node indexes, ordered by first member."""
        find, root = self.find, self._root
        by_root: dict[int, list[int]] = {}
        for index, up in enumerate(root):
            if root[up] != up:
                up = find(up)
            by_root.setdefault(up, []).append(index)
        return list(by_root.values())

    def _positions(self, index: int) -> list[tuple[Position, int]]:
        """Where each op neighbour of one node sits relative to it, as (position, neighbour)."""
        points, nodes = self.points, self.nodes
        out: list[tuple[Position, int]] = []
        keys: set[Position] = set()
        node = nodes[index]
        for parent, slot in node.parents:
            point = points[parent]
            if point != NOT_AN_OP:
                key = (_PARENT, point, slot, 0)
                if key in keys:
                    key = _next_free(key, keys)
                keys.add(key)
                out.append((key, parent))
        for child in node.children:
            point = points[child]
            if point != NOT_AN_OP:
                for parent, slot in nodes[child].parents:
                    if parent == index:  # the first slot it was passed in
                        break
                key = (_CHILD, point, slot, 0)
                if key in keys:
                    key = _next_free(key, keys)
                keys.add(key)
                out.append((key, child))
        return out


def _next_free(key: Position, keys: set[Position]) -> Position:
    """`key` with its last field (n-th neighbour) counted up until it is not in `keys`."""
    while key in keys:
        key = key[:3] + (key[3] + 1,)
    return key
