"""Drawing the backward graph: autograd nodes tied to forward layers, parameters by address."""
from __future__ import annotations

from typing import TYPE_CHECKING

from torchlog.vis.autograd import (
    GRAD_INPUT, GRAD_OP, GRAD_OUTPUT, GRAD_PARAM, PARAM_PREFIX, GradNode, backward_graph,
)
from torchlog.vis.graph import GRAD_FN, GRAD_LEAF, INPUT, OUTPUT, Edge, Node, VisGraph
from torchlog.vis.options import RenderOptions
from torchlog.vis.text import caption_lines, shape_text

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["build_backward_graph", "BACKWARD_CAPTION"]

BACKWARD_CAPTION = "backward (autograd) graph"
_KINDS = {GRAD_OP: GRAD_FN, GRAD_PARAM: GRAD_LEAF, GRAD_INPUT: INPUT, GRAD_OUTPUT: OUTPUT}


def build_backward_graph(history: "ModelHistory", options: RenderOptions) -> VisGraph:
    """The autograd graph of `history` (see `torchlog.vis.autograd`) as a drawable graph.

    Edges run from each node's next functions to it, as torchviz draws them, and carry
    the shape of the tensor whose gradient flows along them. Module boxes are not drawn:
    each node names its layer and module call instead.

    Example:
        >>> import torch, torchlog
        >>> from torchlog.vis import RenderOptions
        >>> h = torchlog.log_forward_pass(torch.nn.Linear(3, 2), torch.ones(1, 3))
        >>> g = build_backward_graph(h, RenderOptions(mode="backward"))
        >>> [node.lines[0] for node in g.nodes]
        ['weight', 'bias', 'AddmmBackward0', 'output_1_2']
    """
    rebuilt = backward_graph(history)
    caption = caption_lines(history) + (BACKWARD_CAPTION,) if options.show_legend else ()
    graph = VisGraph(history.model_name, options.rankdir, caption=caption)
    shapes = {node.key: node.shape for node in rebuilt.nodes}
    graph.nodes = [Node(node.key, _lines(node), _KINDS[node.kind], None) for node in rebuilt.nodes]
    graph.edges = [Edge(tail, head, shape_text(shapes[tail])) for tail, head in rebuilt.edges]
    return graph


def _lines(node: GradNode) -> tuple[str, ...]:
    """Name first, then what it belongs to, shapes, and the gradient when one was saved."""
    if node.kind == GRAD_PARAM:
        return (node.key[len(PARAM_PREFIX):], shape_text(node.shape), node.name)
    if node.kind == GRAD_OUTPUT:
        lines = [node.name, shape_text(node.shape)]
    elif node.kind == GRAD_INPUT:
        lines = [node.label or "", shape_text(node.shape), node.name]
    else:
        where = f" in {node.module}" if node.module else ""
        lines = [node.name, f"{node.label}{where}", shape_text(node.shape)]
    if node.grad_shape is not None:
        lines.append(f"grad {shape_text(node.grad_shape)}, norm {node.grad_norm:.4g}")
    return tuple(lines)
