"""Gradient edges: drawn backwards, child to parent, where a pass holds its gradient."""
from __future__ import annotations

from typing import TYPE_CHECKING

from torchlog.vis.graph import GRADIENT, Edge
from torchlog.vis.placement import Placement
from torchlog.vis.text import shape_text

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["gradient_edges"]


def gradient_edges(history: "ModelHistory", placement: Placement) -> list[Edge]:
    """One backward edge into each pass whose `grad_contents` is set, from each of its children.

    The edge carries the gradient's shape. Nothing is drawn for a history without
    gradients, so this costs one scan of the passes.
    """
    edges: dict[Edge, None] = {}
    for record in history:
        grad = record.grad_saved  # a tensor, or a StoredTensor whose shape needs no read
        head = placement.unit_of.get(record.label)
        if grad is None or head is None:
            continue
        for child in record.children:
            tail = placement.unit_of.get(child)
            if tail is None or tail == head:
                continue
            edges.setdefault(Edge(tail, head, shape_text(grad.shape), kind=GRADIENT), None)
    return list(edges)
