"""The autograd graph behind a logged forward pass, rebuilt from the records (no graphviz).

Each op whose output has a `grad_fn` is one autograd node, tied to the pass that made it
(its label and module call). Its edges lead to the nodes of the parents it received and
to one `AccumulateGrad` node per parameter it used, named by the parameter's address;
inputs that require grad are leaves too. As in torchviz, edges point from a node's
next functions to it, and the graph is what the model's outputs reach. Autograd work done
inside one torch call (the `TBackward0` inside `F.linear`) is part of that op's node, as
the op is one node of the forward graph. Being built from records, it works on logs read
back from disk.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from torchlog.records import PassRecord

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["GradNode", "BackwardGraph", "backward_graph", "GRAD_OP", "GRAD_PARAM", "GRAD_INPUT",
           "GRAD_OUTPUT", "PARAM_PREFIX"]

GRAD_OP, GRAD_PARAM, GRAD_INPUT, GRAD_OUTPUT = "grad_fn", "param", "input", "output"
PARAM_PREFIX = "param "  # keys of parameter leaves; labels never hold a space


@dataclass(frozen=True, slots=True)
class GradNode:
    """One node of the backward graph."""

    key: str  # the forward pass label, or 'param fc.weight'
    kind: str  # GRAD_OP, GRAD_PARAM, GRAD_INPUT or GRAD_OUTPUT
    name: str  # 'AddmmBackward0', 'AccumulateGrad', or the output's label
    label: str | None  # the forward pass it belongs to; None for parameters
    module: str | None  # innermost module call of that pass ('block1.inner:1')
    shape: tuple[int, ...]  # of the forward tensor (the parameter, for leaves)
    grad_shape: tuple[int, ...] | None = None  # of the saved gradient, when there is one
    grad_norm: float | None = None  # its L2 norm


@dataclass(slots=True)
class BackwardGraph:
    """Nodes from the outputs back to the leaves, and (next function, node) edges."""

    nodes: list[GradNode] = field(default_factory=list)
    edges: list[tuple[str, str]] = field(default_factory=list)


def backward_graph(history: "ModelHistory") -> BackwardGraph:
    """Rebuild the autograd graph of `history` from its records.

    A pass that returned its parent unchanged (it shares the parent's saved tensor)
    shares the parent's node, and the outputs of one multi-output call share one node
    when its grad_fn is the op's own (`split` -> `SplitBackward0`), as in torch. Outputs
    that a composite op makes with separate autograd nodes (the `StackBackward0` of an
    LSTM's h and c) stay apart. Ops that autograd never saw (no_grad, integer results)
    are left out.

    Example:
        >>> import torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.Linear(3, 2), torch.ones(1, 3))
        >>> g = backward_graph(h)
        >>> [(n.key, n.name) for n in g.nodes]
        [('param weight', 'AccumulateGrad'), ('param bias', 'AccumulateGrad'), \
('linear_1_1', 'AddmmBackward0'), ('output_1_2', 'output_1_2')]
        >>> g.edges
        [('param weight', 'linear_1_1'), ('param bias', 'linear_1_1'), ('linear_1_1', 'output_1_2')]
    """
    by_label = {record.label: record for record in history}
    owner: dict[str, str] = {}  # pass label -> key of its autograd node
    graph = BackwardGraph()
    nodes: dict[str, GradNode] = {}
    previous: PassRecord | None = None
    for record in history:
        key = _node_of(record, previous, by_label, owner)
        previous = record
        if key is None:
            continue
        owner[record.label] = key
        if key == record.label:
            _add_node(record, by_label, graph, nodes, owner)
    return _reachable(graph, history, owner)


def _node_of(record: PassRecord, previous: PassRecord | None, by_label: dict[str, PassRecord],
             owner: dict[str, str]) -> str | None:
    """The key of the autograd node holding `record`'s grad_fn; None when it has none."""
    if record.is_output:
        return record.label if record.parents and record.parents[0].label in owner else None
    if record.is_input:
        return record.label if _requires_grad(record) else None
    if record.grad_fn_name is None:
        return None
    parents = record.parent_labels
    if len(parents) == 1 and parents[0] in owner:
        parent = by_label[parents[0]]
        if record.saved is not None and record.saved is parent.saved \
                and parent.grad_fn_name == record.grad_fn_name:
            return owner[parent.label]  # returned its input: the same tensor, the same grad_fn
    if (previous is not None and record.output_index > 0 and previous.label in owner
            and previous.grad_fn_name == record.grad_fn_name and previous.parents == record.parents
            and record.grad_fn_name.lower().startswith(record.layer_type)):
        return owner[previous.label]  # another output of the call, from the op's own grad_fn
    return record.label


def _requires_grad(record: PassRecord) -> bool:
    saved = record.saved
    return record.has_grad or (isinstance(saved, torch.Tensor) and saved.requires_grad)


def _add_node(record: PassRecord, by_label: dict[str, PassRecord], graph: BackwardGraph,
              nodes: dict[str, GradNode], owner: dict[str, str]) -> None:
    grad_shape, grad_norm = _gradient(record)
    if record.is_output:
        kind, name = GRAD_OUTPUT, record.label
    elif record.is_input:
        kind, name = GRAD_INPUT, "AccumulateGrad"
    else:
        kind, name = GRAD_OP, record.grad_fn_name or ""
    module = record.containing_modules[0] if record.containing_modules else None
    for param in record.params:
        leaf = PARAM_PREFIX + param.address
        if leaf not in nodes:
            nodes[leaf] = GradNode(leaf, GRAD_PARAM, "AccumulateGrad", None, None, tuple(param.shape))
            graph.nodes.append(nodes[leaf])
        graph.edges.append((leaf, record.label))
    nodes[record.label] = GradNode(record.label, kind, name, record.label, module,
                                   tuple(record.shape), grad_shape, grad_norm)
    graph.nodes.append(nodes[record.label])
    for parent in record.parent_labels:
        if parent in owner and owner[parent] != record.label:
            graph.edges.append((owner[parent], record.label))


def _gradient(record: PassRecord) -> tuple[tuple[int, ...] | None, float | None]:
    if not record.has_grad:
        return None, None
    grad = record.grad_contents
    if not isinstance(grad, torch.Tensor):
        return None, None
    norm = torch.linalg.vector_norm(grad.detach().to(torch.float64)).item() if grad.numel() else 0.0
    return tuple(grad.shape), norm


def _reachable(graph: BackwardGraph, history: "ModelHistory", owner: dict[str, str]) -> BackwardGraph:
    """Keep what the outputs reach (everything, when a partial history has no output)."""
    roots = [owner[label] for label in history.output_layers if label in owner]
    if not roots:
        return graph
    into: dict[str, list[str]] = {}
    for tail, head in graph.edges:
        into.setdefault(head, []).append(tail)
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        key = stack.pop()
        if key not in seen:
            seen.add(key)
            stack.extend(into.get(key, ()))
    return BackwardGraph([n for n in graph.nodes if n.key in seen],
                         [e for e in graph.edges if e[0] in seen and e[1] in seen])
