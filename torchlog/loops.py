"""Grouping op executions into layers: repeated uses of parameters and loops become passes.

Rules, applied in one deterministic sweep after the forward pass:

1. Each op gets a signature: function, module path (without call numbers), the
   parameters it used, which output of a multi-output op it is and, for ops without
   parameters, the instruction of user code that called it (and where each enclosing
   module was called from).
2. Ops with parameters and equal signatures are passes of one layer (the same
   weights applied again).
3. From each such group we expand outwards in lockstep: neighbours that sit in the
   same position relative to every pass (same signature, same argument slot) become
   passes of a layer too. When two readings compete for a node, the one covering
   more passes wins, so `fc -> +1 -> *2` loops fold whole.
4. Parameter-free ops with equal signatures fold only when they form a chain (each
   is an ancestor of the next, as in a loop) and, after the lockstep expansion, at
   least one iteration's body is matched completely. Parallel branches and runs of
   ops that merely share a function name therefore stay separate layers.
"""
from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Sequence

from torchlog.capture.nodes import RawNode

_UNCLAIMED = -1
_PAIRS_TO_TRY = 8  # consecutive members of a chain examined for a repeating iteration
_TENTATIVE = -2


def _signature(node: RawNode) -> tuple | None:
    if node.kind != "op":
        return None  # inputs, outputs, buffers and foreign tensors never fold
    modules = tuple(address for address, _ in node.module_path)
    params = tuple(p.address for p in node.params)
    # Parameter-free ops also need the same call site (code instruction, and where each
    # enclosing module was called from): a loop runs one instruction many times, while
    # a module called before a loop and inside it is called from two places.
    site = None if params else node.site
    return (node.func_name, modules, params, node.output_index, site)


class _Grouper:
    def __init__(self, nodes: Sequence[RawNode]) -> None:
        self.nodes = nodes
        self.sigs = [_signature(n) for n in nodes]
        self.layer_of = [_UNCLAIMED] * len(nodes)
        self.layers: list[list[int]] = []
        self.tentative: list[int] = []
        self.sig_counts: dict[tuple, int] = {}
        # For each child, where each of its parents was passed (first slot wins).
        self.child_slot: list[dict[int, object]] = []
        for node in nodes:
            slots: dict[int, object] = {}
            for parent, arg in node.parents:
                slots.setdefault(parent, arg)
            self.child_slot.append(slots)

    # ----- lockstep expansion -----------------------------------------------------------
    def _neighbour_buckets(self, role: list[int | None]) -> dict[tuple, list[int | None]]:
        """Unclaimed op neighbours of each pass of `role`, keyed by their relative position."""
        buckets: dict[tuple, list[int | None]] = {}
        width = len(role)
        for pos, index in enumerate(role):
            if index is None:
                continue
            seen: dict[tuple, int] = defaultdict(int)
            node = self.nodes[index]
            steps = [("p", p, arg) for p, arg in node.parents]
            steps += [("c", c, self.child_slot[c].get(index)) for c in node.children]
            for direction, other, arg in steps:
                if self.layer_of[other] != _UNCLAIMED or self.sigs[other] is None:
                    continue
                base = (direction, self.sigs[other], repr(arg))
                nth = seen[base]
                seen[base] += 1
                slot = buckets.setdefault(base + (nth,), [None] * width)
                if slot[pos] is None:
                    slot[pos] = other
        return buckets

    @staticmethod
    def _distinct(candidate: list[int | None]) -> list[int | None]:
        # A node reached from two passes is a join (a cat of all passes): not a pass itself.
        counts: dict[int, int] = defaultdict(int)
        for index in candidate:
            if index is not None:
                counts[index] += 1
        return [i if i is not None and counts[i] == 1 else None for i in candidate]

    def _expand(self, seed: list[int]) -> list[list[int | None]]:
        """Claim (tentatively) every role that lines up with the passes of `seed`."""
        roles: list[list[int | None]] = [list(seed)]
        for index in seed:
            self._claim(index)
        heap: list[tuple] = []
        counter = 0

        def push_from(role: list[int | None]) -> None:
            nonlocal counter
            for key, cand in self._neighbour_buckets(role).items():
                cand = self._distinct(cand)
                size = sum(i is not None for i in cand)
                if size >= 2:
                    first = min(i for i in cand if i is not None)
                    counter += 1
                    heapq.heappush(heap, (-size, first, counter, cand))

        push_from(roles[0])
        while heap:
            neg_size, first, _, cand = heapq.heappop(heap)
            cand = [i if i is not None and self.layer_of[i] == _UNCLAIMED else None for i in cand]
            size = sum(i is not None for i in cand)
            if size < 2:
                continue
            if size < -neg_size:  # shrank since pushed: let larger candidates go first
                counter += 1
                heapq.heappush(heap, (-size, min(i for i in cand if i is not None), counter, cand))
                continue
            for index in cand:
                if index is not None:
                    self._claim(index)
            roles.append(cand)
            push_from(cand)
        return roles

    def _claim(self, index: int) -> None:
        self.layer_of[index] = _TENTATIVE
        self.tentative.append(index)

    def _commit(self, roles: list[list[int | None]]) -> None:
        for role in roles:
            members = [i for i in role if i is not None]
            layer = len(self.layers)
            self.layers.append(sorted(members))
            for index in members:
                self.layer_of[index] = layer
        self.tentative.clear()

    def _rollback(self) -> None:
        for index in self.tentative:
            self.layer_of[index] = _UNCLAIMED
        self.tentative.clear()

    # ----- chains of parameter-free ops -------------------------------------------------------
    def _between(self, start: int, end: int) -> set[int] | None:
        """Nodes on paths start -> end (start included, end excluded); None if end is not reachable."""
        forward = {start}
        for index in range(start, end):
            if index in forward:
                forward.update(c for c in self.nodes[index].children if c <= end)
        if end not in forward:
            return None
        backward = {end}
        for index in range(end, start - 1, -1):
            if index in backward:
                backward.update(p for p, _ in self.nodes[index].parents if p >= start)
        return (forward & backward) - {end}

    def _chained_runs(self, members: list[int]) -> list[list[int]]:
        runs: list[list[int]] = [[members[0]]]
        for prev, cur in zip(members, members[1:]):
            if self._reaches(prev, cur):
                runs[-1].append(cur)
            else:
                runs.append([cur])
        return [run for run in runs if len(run) >= 2]

    def _reaches(self, start: int, end: int) -> bool:
        stack, seen = [end], {end}
        while stack:
            index = stack.pop()
            for parent, _ in self.nodes[index].parents:
                if parent == start:
                    return True
                if parent > start and parent not in seen:
                    seen.add(parent)
                    stack.append(parent)
        return False

    def _could_repeat(self, run: list[int]) -> bool:
        """Cheap test before the expansion: some iteration holds only unclaimed nodes whose
        signature occurs at least twice (a one-off op, such as a Linear with its own
        weights, can never be matched in another pass). Only the first iterations are
        looked at, so a long run that is not a loop costs a bounded amount."""
        for a, b in zip(run[:_PAIRS_TO_TRY], run[1:_PAIRS_TO_TRY + 1]):
            body = self._between(a, b)
            if body is not None and all(
                    self.layer_of[i] == _UNCLAIMED and self.sig_counts[self.sigs[i]] >= 2
                    for i in body):
                return True
        return False

    def _fold_chain(self, run: list[int]) -> None:
        if not self._could_repeat(run):
            return
        roles = self._expand(run)
        claimed = set(self.tentative)
        used_by: dict[int, int] = defaultdict(int)  # op parent -> how many claimed nodes read it
        for index in claimed:
            for parent in {p for p, _ in self.nodes[index].parents}:
                used_by[parent] += 1
        for a, b in zip(run, run[1:]):
            if self._is_iteration(a, b, claimed, used_by):
                self._commit(roles)
                return
        self._rollback()

    def _is_iteration(self, start: int, end: int, claimed: set[int], used_by: dict[int, int]) -> bool:
        """Does start..end look like one whole loop iteration?

        Every node on the way must be matched in another pass, and everything the
        iteration reads from outside must be matched too or be loop-invariant (read
        by several passes). `a + b + c` fails: `c` is read once and matches nothing.
        """
        body = self._between(start, end)
        if body is None or not body <= claimed:
            return False
        for index in (body - {start}) | {end}:
            for parent, _ in self.nodes[index].parents:
                if parent in body or used_by[parent] >= 2 and parent not in claimed:
                    continue  # inside the iteration, or loop-invariant
                # A matched input must be made during this iteration: in `a + b + c`
                # b and c were computed before the first add, not between the adds.
                if parent not in claimed or parent < start:
                    return False
        return True

    # ----- driver ------------------------------------------------------------------------
    def group(self) -> list[list[int]]:
        by_sig: dict[tuple, list[int]] = defaultdict(list)
        for index, sig in enumerate(self.sigs):
            if sig is not None:
                by_sig[sig].append(index)
        self.sig_counts = {s: len(m) for s, m in by_sig.items()}
        with_params = [m for s, m in by_sig.items() if s[2]]
        without = [m for s, m in by_sig.items() if not s[2] and len(m) >= 2]
        for members in sorted(with_params, key=lambda m: m[0]):
            free = [i for i in members if self.layer_of[i] == _UNCLAIMED]
            if len(free) >= 2:
                self._commit(self._expand(free))
        for members in sorted(without, key=lambda m: m[0]):
            free = [i for i in members if self.layer_of[i] == _UNCLAIMED]
            if len(free) >= 2:
                for run in self._chained_runs(free):
                    run = [i for i in run if self.layer_of[i] == _UNCLAIMED]
                    if len(run) >= 2:
                        self._fold_chain(run)
        for index, layer in enumerate(self.layer_of):
            if layer == _UNCLAIMED:
                self.layer_of[index] = len(self.layers)
                self.layers.append([index])
        self.layers.sort(key=lambda members: members[0])
        return self.layers


def group_into_layers(nodes: Sequence[RawNode]) -> list[list[int]]:
    """Partition node indexes into layers; each layer's passes in execution order.

    Layers are returned ordered by their first pass. Deterministic: depends only on
    the nodes, their order and their links.
    """
    return _Grouper(nodes).group()
