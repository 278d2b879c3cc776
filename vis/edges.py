"""The data edges of the drawn graph: per pass (unrolled) or per layer (rolled)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchlog.labels import split_pass
from torchlog.records import LayerRecord, PassRecord, PassSpan
from torchlog.vis.graph import Edge
from torchlog.vis.placement import Placement
from torchlog.vis.text import arg_text, passes_text, shape_text

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["SYMMETRIC_OPS", "args_between", "shows_arg", "unrolled_edges", "rolled_edges", "failure_edges"]

# Layer types whose tensor arguments can be swapped without changing the result.
SYMMETRIC_OPS = frozenset({
    "add", "mul", "eq", "ne", "maximum", "minimum", "fmax", "fmin", "hypot",
    "logicaland", "logicalor", "logicalxor", "bitwiseand", "bitwiseor", "bitwisexor",
    "and", "or", "xor", "output",
})


def shows_arg(record: PassRecord) -> bool:
    """True when the edges into `record` must say which argument they fill."""
    return len(record.parents) > 1 and record.layer_type not in SYMMETRIC_OPS


def _label(shape: tuple[int, ...], arg: Any, with_arg: bool) -> str:
    text = arg_text(arg) if with_arg else ""
    return shape_text(shape) + (f"\n{text}" if text else "")


def unrolled_edges(history: "ModelHistory", placement: Placement) -> list[Edge]:
    """One edge per tensor argument between visible nodes, duplicates merged.

    Edges inside one collapsed module vanish; edges into a collapsed module do not
    name arguments, since they feed different ops inside it.
    """
    by_label = {record.label: record for record in history}
    edges: dict[Edge, None] = {}
    for record in history:
        head = placement.unit_of.get(record.label)
        if head is None:
            continue
        with_arg = shows_arg(record) and not placement.is_module(head)
        for parent in record.parents:
            tail = placement.unit_of.get(parent.label)
            if tail is None or tail == head:
                continue
            shape = by_label[parent.label].shape
            edges.setdefault(Edge(tail, head, _label(shape, parent.arg, with_arg)), None)
    return list(edges)


def rolled_edges(history: "ModelHistory", placement: Placement) -> list[Edge]:
    """One edge per linked pair of layers, saying which passes it carries when not all.

    `Out 1-3` at the tail: only passes 1-3 of the parent feed the child; `In 2-4` at
    the head: only passes 2-4 of the child read the parent.
    """
    layers = {layer.label: layer for layer in history.layers}
    edges: dict[Edge, None] = {}
    for layer in history.layers:
        head = _layer_unit(layer, placement)
        if head is None:
            continue
        for parent_label, span in layer.parent_layers.items():
            parent = layers.get(parent_label)
            tail = _layer_unit(parent, placement) if parent is not None else None
            if tail is None or tail == head:
                continue
            for edge in _rolled_edges(parent, layer, span, tail, head, placement):
                edges.setdefault(edge, None)
    return list(edges)


def _layer_unit(layer: LayerRecord, placement: Placement) -> str | None:
    for record in layer.passes:
        key = placement.unit_of.get(record.label)
        if key is not None:
            return key
    return None


def _rolled_edges(parent: LayerRecord, child: LayerRecord, span: PassSpan, tail: str, head: str,
                  placement: Placement) -> list[Edge]:
    """The edges from `parent` to `child`: one per argument slot when the order matters."""
    if placement.is_module(tail) or placement.is_module(head):
        return [Edge(tail, head, shape_text(parent.first.shape))]
    out_text = _span_text("Out", span.parent_passes, parent.num_passes)
    in_text = _span_text("In", span.child_passes, child.num_passes)
    args = args_between(parent, child, span.child_passes) if shows_arg(child.first) else [()]
    return [Edge(tail, head, _label(parent.first.shape, arg, True), out_text, in_text)
            for arg in args or [()]]


def _span_text(word: str, pass_nums: tuple[int, ...], num_passes: int) -> str:
    return "" if len(set(pass_nums)) == num_passes else f"{word} {passes_text(pass_nums)}"


def args_between(parent: LayerRecord, child: LayerRecord, child_passes: tuple[int, ...]) -> list[Any]:
    """The distinct argument slots through which `child` reads `parent`, in first-seen order."""
    args: dict[Any, None] = {}
    for num in child_passes:
        if not 1 <= num <= child.num_passes:
            continue
        for edge in child[num].parents:
            if split_pass(edge.label)[0] == parent.label:
                args.setdefault(edge.arg, None)
    return list(args)


def failure_edges(history: "ModelHistory", placement: Placement, failed_key: str) -> list[Edge]:
    """Edges from the inputs of the op that raised to its red node."""
    by_label = {record.label: record for record in history}
    edges: dict[Edge, None] = {}
    for label in history.info.failed_parents:
        tail = placement.unit_of.get(label)
        if tail is not None:
            edges.setdefault(Edge(tail, failed_key, shape_text(by_label[label].shape)), None)
    return list(edges)
