"""Lockstep closure (torchlog/lockstep.py) against a brute-force fixpoint on small random graphs."""
from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from torchlog.lockstep import NOT_AN_OP, LockstepUnion


def _graph(parent_lists: list[list[tuple[int, int]]]) -> list[SimpleNamespace]:
    """Nodes with `parents` [(node, slot)] and `children` [node] lists, as capture makes them."""
    nodes = [SimpleNamespace(parents=parents, children=[]) for parents in parent_lists]
    for index, node in enumerate(nodes):
        for parent, _ in node.parents:
            if index not in nodes[parent].children:
                nodes[parent].children.append(index)
    return nodes


def _neighbours(nodes: list, points: list[int], index: int) -> dict[tuple, int]:
    """(direction, point, slot, n-th such neighbour) -> neighbour, written out plainly."""
    out: dict[tuple, int] = {}
    listed = [("parent", p, slot) for p, slot in nodes[index].parents]
    listed += [("child", c, next(s for p, s in nodes[c].parents if p == index))
               for c in nodes[index].children]
    for direction, other, slot in listed:
        if points[other] == NOT_AN_OP:
            continue
        nth = sum(1 for key in out if key[:3] == (direction, points[other], slot))
        out[(direction, points[other], slot, nth)] = other
    return out


def _fixpoint(nodes: list, points: list[int], seeds: list[list[int]]) -> list[list[int]]:
    """Join seeds, then join same-place neighbours of joined nodes until nothing changes."""
    group = list(range(len(nodes)))

    def merge(a: int, b: int) -> bool:
        old, new = group[b], group[a]
        if old == new:
            return False
        group[:] = [new if g == old else g for g in group]
        return True

    for seed in seeds:
        for other in seed[1:]:
            merge(seed[0], other)
    changed = True
    while changed:
        changed = False
        for a in range(len(nodes)):
            for b in range(len(nodes)):
                if a != b and group[a] == group[b]:
                    near_a, near_b = _neighbours(nodes, points, a), _neighbours(nodes, points, b)
                    for key in near_a.keys() & near_b.keys():
                        changed |= merge(near_a[key], near_b[key])
    by_group: dict[int, list[int]] = {}
    for index, g in enumerate(group):
        by_group.setdefault(g, []).append(index)
    return list(by_group.values())


@st.composite
def graphs_with_seeds(draw: st.DrawFn) -> tuple[list, list[int], list[list[int]]]:
    size = draw(st.integers(2, 14))
    parent_lists = [[]]
    for index in range(1, size):
        parents = draw(st.lists(st.integers(0, index - 1), max_size=2))
        parent_lists.append([(p, slot) for slot, p in enumerate(parents)])
    points = [NOT_AN_OP] + draw(st.lists(st.integers(0, 2), min_size=size - 1, max_size=size - 1))
    by_point: dict[int, list[int]] = {}
    for index, point in enumerate(points):
        if point != NOT_AN_OP:
            by_point.setdefault(point, []).append(index)
    seeds = [draw(st.lists(st.sampled_from(members), min_size=2, max_size=4, unique=True))
             for members in by_point.values() if len(members) > 1 and draw(st.booleans())]
    return _graph(parent_lists), points, seeds


def _closure(nodes: list, points: list[int], seeds: list[list[int]]) -> list[list[int]]:
    union = LockstepUnion(nodes, points)
    for seed in seeds:
        union.join_all(seed)
    return union.components()


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(graphs_with_seeds())
def test_closure_equals_the_brute_force_fixpoint_in_any_seed_order(case) -> None:
    nodes, points, seeds = case
    expected = _fixpoint(nodes, points, seeds)
    assert _closure(nodes, points, seeds) == expected
    backwards = [list(reversed(seed)) for seed in reversed(seeds)]
    assert _closure(nodes, points, backwards) == expected
    for members in expected:
        assert len({points[m] for m in members}) == 1, f"{members} mixes program points"


def test_joining_two_passes_joins_their_loop_bodies() -> None:
    # input -> a1 -> b1 -> a2 -> b2 -> a3 -> b3: a is seeded, b follows in lockstep.
    nodes = _graph([[], [(0, 0)], [(1, 0)], [(2, 0)], [(3, 0)], [(4, 0)], [(5, 0)]])
    points = [NOT_AN_OP, 0, 1, 0, 1, 0, 1]
    union = LockstepUnion(nodes, points)
    union.join_all([1, 3, 5])
    assert union.components() == [[0], [1, 3, 5], [2, 4, 6]]
    assert union.is_joined([2, 4, 6]) and not union.is_joined([1, 2])


def test_a_join_read_by_every_pass_stays_one_node() -> None:
    # a1 and a2 (joined) both feed one cat-like node: it is not a pass of anything.
    nodes = _graph([[], [(0, 0)], [(1, 0)], [(1, 0), (2, 1)]])
    points = [NOT_AN_OP, 0, 0, 1]
    union = LockstepUnion(nodes, points)
    union.join_all([1, 2])
    assert union.components() == [[0], [1, 2], [3]]
