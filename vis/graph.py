"""The drawn graph as plain data: nodes, edges and module boxes, before any DOT text."""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["INPUT", "OUTPUT", "PARAM", "BUFFER", "CREATED", "OP", "MODULE", "FAILED", "INTERVENED", "DATA",
           "GRADIENT", "GRAD_FN", "GRAD_LEAF", "Node", "Edge", "Cluster", "VisGraph"]

# Node kinds, each drawn in its own style (see vis/style.py).
INPUT, OUTPUT, PARAM, BUFFER, CREATED, OP, MODULE, FAILED = (
    "input", "output", "param", "buffer", "created", "op", "module", "failed")
INTERVENED = "intervened"  # a pass an intervention changed (torchlog.interventions)
DATA, GRADIENT = "data", "gradient"
GRAD_FN, GRAD_LEAF = "grad_fn", "grad_leaf"  # nodes of the backward graph (mode='backward')


@dataclass(frozen=True, slots=True)
class Node:
    """One drawn node: a pass, a layer, a collapsed module or the op that raised."""

    key: str  # DOT id: a pass or layer label, 'module addr[:call]', or 'failed op'
    lines: tuple[str, ...]  # label text, one entry per line
    kind: str  # one of the kinds above
    cluster: str | None  # key of the innermost module box holding it; None at top level
    is_inplace: bool = False  # drawn with a double border


@dataclass(frozen=True, slots=True)
class Edge:
    """One drawn edge from `tail` to `head`."""

    tail: str
    head: str
    label: str = ""  # tensor shape, and which argument when the order matters
    taillabel: str = ""  # rolled view: which passes of the tail send it ('Out 1-3')
    headlabel: str = ""  # rolled view: which passes of the head receive it ('In 2-4')
    kind: str = DATA  # DATA, or GRADIENT for a backward edge


@dataclass(frozen=True, slots=True)
class Cluster:
    """A module box: one call of a module (unrolled) or all its calls (rolled)."""

    key: str  # 'block1.inner:1' unrolled, 'block1.inner' rolled
    label: str  # 'block1.inner (Inner)', with the call or call count
    parent: str | None  # key of the enclosing box; None at top level
    depth: int  # 1 for a top-level module


@dataclass(slots=True)
class VisGraph:
    """Everything the DOT writer needs, in a deterministic order."""

    name: str  # the model's class name
    rankdir: str  # 'BT', 'TB' or 'LR'
    nodes: list[Node] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    clusters: dict[str, Cluster] = field(default_factory=dict)  # in order of first appearance
    caption: tuple[str, ...] = ()  # model facts shown above the graph; empty = no legend
