"""A ModelHistory as a networkx MultiDiGraph: one node per pass or layer, one edge per argument."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError
from torchlog.export.activations import require_saved
from torchlog.optional import require
from torchlog.export.pass_facts import layer_facts, pass_facts
from torchlog.records import PassRecord

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["to_networkx", "GRAPH_MODES"]

GRAPH_MODES = ("unrolled", "rolled")


def to_networkx(history: "ModelHistory", mode: str = "unrolled",
                include_values: bool = False) -> Any:
    """Build a `networkx.MultiDiGraph` of the logged forward pass.

    Unrolled: one node per pass keyed by its label (`'linear_1_1:2'`); rolled: one node
    per layer keyed by the layer label. Node attributes are the record's fields (see
    `torchlog.export.pass_facts`): `function`, `shape`, `dtype`, `num_bytes`, `module`,
    `modules` (addresses outermost first), `call_site`, `elapsed_s`, `num_passes`, ...;
    with `include_values=True` also `value`, the saved activation (a list per pass when
    rolled). Each tensor argument gives one edge from the pass that produced it, with
    `arg` (position, keyword or path into a nested argument), `shape` and `dtype`; rolled
    edges also carry `passes`, the (parent pass, child pass) numbers they join, so a
    loop shows as a cycle. Edges from passes the history left out (`layers_to_save`)
    are dropped. The graph's own attributes hold the model name and, for a partial
    history, where it stopped.

    Raises:
        MissingDependencyError: networkx is not installed (`pip install torchlog[networkx]`).
        InvalidOptionError: `mode` is not 'unrolled' or 'rolled', or `include_values` is
            asked of a history without saved activations.
        InvalidArgumentTypeError: `include_values` is not a bool.

    Example:
        >>> import torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.Linear(3, 2), torch.ones(1, 3))
        >>> g = to_networkx(h)
        >>> list(g.nodes), list(g.edges(data='arg'))
        (['input_1_0', 'linear_1_1', 'output_1_2'], [('input_1_0', 'linear_1_1', 0), \
('linear_1_1', 'output_1_2', ())])
        >>> g.nodes['linear_1_1']['function'], g.nodes['linear_1_1']['num_params']
        ('linear', 8)
    """
    if not isinstance(mode, str) or mode not in GRAPH_MODES:
        raise InvalidOptionError(f"mode must be one of {GRAPH_MODES}, got {mode!r}")
    if not isinstance(include_values, bool):
        raise InvalidArgumentTypeError(f"include_values must be True or False, got {include_values!r}")
    if include_values:
        require_saved(history, "include_values=True")
    nx = require("networkx", "history.to_networkx()")
    graph = nx.MultiDiGraph(model_name=history.model_name, mode=mode,
                            is_partial=history.is_partial, failure=history.info.failure)
    if mode == "unrolled":
        _add_passes(graph, history, include_values)
    else:
        _add_layers(graph, history, include_values)
    return graph


def _add_passes(graph: Any, history: "ModelHistory", include_values: bool) -> None:
    for record in history:
        facts = pass_facts(record)
        if include_values:
            facts["value"] = record.tensor_contents
        graph.add_node(record.label, **facts)
    by_label = {record.label: record for record in history}
    for record in history:
        for edge in record.parents:
            parent = by_label.get(edge.label)
            if parent is not None:
                graph.add_edge(edge.label, record.label, arg=edge.arg, shape=tuple(parent.shape),
                               dtype=str(parent.dtype))


def _add_layers(graph: Any, history: "ModelHistory", include_values: bool) -> None:
    """Layer nodes; one edge per (parent layer, argument) with the pass pairs it joins."""
    present: dict[str, list[PassRecord]] = {}
    for record in history:
        present.setdefault(record.layer_label, []).append(record)
    for label, passes in present.items():
        facts = layer_facts(passes)
        if include_values:
            facts["value"] = [p.tensor_contents for p in passes]
        graph.add_node(label, **facts)
    joined: dict[tuple[str, str, Any], list[tuple[int, int]]] = {}
    shapes: dict[tuple[str, str, Any], PassRecord] = {}
    by_label = {record.label: record for record in history}
    for record in history:
        for edge in record.parents:
            parent = by_label.get(edge.label)
            if parent is None:
                continue
            key = (parent.layer_label, record.layer_label, _hashable(edge.arg))
            joined.setdefault(key, []).append((parent.pass_num, record.pass_num))
            shapes.setdefault(key, parent)
    for (tail, head, arg), pairs in joined.items():
        parent = shapes[(tail, head, arg)]
        graph.add_edge(tail, head, arg=arg, shape=tuple(parent.shape), dtype=str(parent.dtype),
                       passes=tuple(pairs))


def _hashable(arg: Any) -> Any:
    return arg if isinstance(arg, (int, str, tuple)) else repr(arg)
