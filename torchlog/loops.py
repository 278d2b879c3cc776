"""Grouping op executions into layers: shared parameters and loops become passes of one layer.

The rule, applied in one deterministic sweep after the forward pass:

1. Every op has a program point: its function, which output of a multi-output op it is
   and either the parameters it applies or, for ops without parameters, its module path
   (addresses without call numbers), the instruction that called it (user code, or the
   body of an expanded Python functional) and where each enclosing module was called
   from. A layer never mixes program points.
2. Shared parameters: ops applying the same parameters with the same function are
   passes of one layer, wherever they run: from any module, line or loop.
3. Chains: executions of a parameter-free program point that follow each other in a
   chain (each an ancestor of the next, in execution order) are passes of one layer when
   between some two consecutive ones every op is at a program point that runs more than
   once (some iteration of the loop repeats). `sin` run on three inputs is not a chain;
   a helper called between different ops (`act(fc1(x))`, `act(fc2(x))`) never repeats.
4. Lockstep: when two ops are passes of one layer, their neighbours in the same place
   (same direction, program point and argument slot) are passes of one layer too, so a
   loop's body folds with any layer in it (`torchlog.lockstep`).

Layers are the smallest grouping satisfying 2-4; since it only ever joins, no reading of
the loop can put two ops that share parameters into different layers.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from torchlog.lockstep import NOT_AN_OP, LockstepUnion
from torchlog.scopes import internal_scope

if TYPE_CHECKING:
    from torchlog.capture import RawNode


def group_into_layers(nodes: Sequence[RawNode]) -> list[list[int]]:
    """Partition node indexes into layers; each layer's passes in execution order.

    Layers are returned ordered by their first pass. Deterministic: depends only on
    the nodes, their order and their links, not on the order rules are applied in.

    >>> group_into_layers([])
    []
    """
    points, groups = _program_points(nodes)
    union = LockstepUnion(nodes, points)
    runs_of = [len(members) for members, _ in groups]
    for members, has_params in groups:
        if has_params and len(members) > 1:
            union.join_all(members)
    for members, has_params in groups:
        if has_params or len(members) < 2 or union.is_joined(members):
            continue
        for run in _chained_runs(nodes, members):
            if any(_repeats(nodes, points, runs_of, a, b) for a, b in zip(run, run[1:])):
                union.join_all(run)
    return union.components()


def _program_points(nodes: Sequence[RawNode]) -> tuple[list[int], list[tuple[list[int], bool]]]:
    """Per node its program point id; per id its executions and whether it has parameters."""
    ids: dict[tuple, int] = {}
    points: list[int] = []
    groups: list[tuple[list[int], bool]] = []
    addresses: dict[int, tuple[str, ...]] = {}  # consecutive ops share one module path tuple
    repeats: dict[tuple, int] = {}  # (torch-internal call, key) -> executions so far
    for index, node in enumerate(nodes):
        if node.kind != "op":
            points.append(NOT_AN_OP)  # inputs, outputs, buffers and foreign tensors never fold
            continue
        if node.params:  # the same weights applied again, from whichever module or line
            key = (node.func_name, tuple(p.address for p in node.params), node.output_index)
        else:
            key = (node.func_name, _addresses(node.module_path, addresses), node.output_index,
                   node.site)
            scope = internal_scope(node)
            if scope is not None:  # torch's own code: its ops share one site, told apart by order
                seen = repeats.get((scope, key), 0)
                repeats[(scope, key)] = seen + 1
                if seen:
                    key = key + (seen,)
        point = ids.get(key)
        if point is None:
            point = ids[key] = len(groups)
            groups.append(([], bool(node.params)))
        points.append(point)
        groups[point][0].append(index)
    return points, groups


def _addresses(path: tuple, known: dict[int, tuple[str, ...]]) -> tuple[str, ...]:
    """Module addresses of a module path, without call numbers; one tuple per path object."""
    addresses = known.get(id(path))
    if addresses is None:  # the path tuples live as long as the nodes: ids stay unique
        addresses = known[id(path)] = tuple(address for address, _ in path)
    return addresses


def _chained_runs(nodes: Sequence[RawNode], members: list[int]) -> list[list[int]]:
    """Maximal runs of consecutive executions in which each is an ancestor of the next."""
    runs: list[list[int]] = [[members[0]]]
    for prev, cur in zip(members, members[1:]):
        if _reaches(nodes, prev, cur):
            runs[-1].append(cur)
        else:
            runs.append([cur])
    return [run for run in runs if len(run) > 1]


def _reaches(nodes: Sequence[RawNode], start: int, end: int) -> bool:
    """Whether `start` is an ancestor of `end`; visits only nodes made in between."""
    stack, seen = [end], {end}
    while stack:
        for parent, _ in nodes[stack.pop()].parents:
            if parent == start:
                return True
            if parent > start and parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return False


def _repeats(nodes: Sequence[RawNode], points: Sequence[int], runs_of: Sequence[int],
             start: int, end: int) -> bool:
    """Whether every op on the paths start -> end (one iteration) runs more than once."""
    body = _between(nodes, start, end)
    return all(points[index] != NOT_AN_OP and runs_of[points[index]] > 1 for index in body)


def _between(nodes: Sequence[RawNode], start: int, end: int) -> set[int]:
    """Nodes on paths start -> end, start included and end excluded (start reaches end)."""
    forward, stack = {start}, [start]
    while stack:
        for child in nodes[stack.pop()].children:
            if child < end and child not in forward:
                forward.add(child)
                stack.append(child)
    body, stack = set(), [end]
    while stack:
        for parent, _ in nodes[stack.pop()].parents:
            if parent in forward and parent not in body:
                body.add(parent)
                stack.append(parent)
    return body
