"""Turn a ModelHistory into the drawn graph (nodes, edges, module boxes) for some options."""
from __future__ import annotations

from typing import TYPE_CHECKING

from torchlog.labels import split_pass
from torchlog.records import ModuleRecord, PassRecord
from torchlog.vis.backward import build_backward_graph
from torchlog.vis.edges import failure_edges, rolled_edges, unrolled_edges
from torchlog.vis.gradients import gradient_edges
from torchlog.vis.graph import FAILED, MODULE, Node, VisGraph
from torchlog.vis.options import RenderOptions
from torchlog.vis.placement import MODULE_PREFIX, Placement, module_title, place
from torchlog.vis.style import kind_of
from torchlog.vis.text import caption_lines, failure_lines, layer_lines, module_lines, pass_lines, shape_text

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["FAILED_KEY", "build_graph"]

FAILED_KEY = "failed op"  # the red node of a partial history; labels never hold a space


def build_graph(history: "ModelHistory", options: RenderOptions) -> VisGraph:
    """Lay out what to draw; reads the history only and never changes it.

    Example:
        >>> import torch, torchlog
        >>> from torchlog.vis import RenderOptions
        >>> h = torchlog.log_forward_pass(torch.nn.Linear(3, 2), torch.ones(1, 3), random_seed=0)
        >>> [node.key for node in build_graph(h, RenderOptions()).nodes]
        ['input_1_0', 'linear_1_1', 'output_1_2']
    """
    if options.mode == "backward":
        return build_backward_graph(history, options)
    placement = place(history, options)
    rolled = options.mode == "rolled"
    graph = VisGraph(history.model_name, options.rankdir, clusters=placement.clusters,
                     caption=caption_lines(history) if options.show_legend else ())
    by_label = {record.label: record for record in history}
    modules = history.modules  # a copy per call: fetch once
    graph.nodes = [_node(key, members, placement, modules, by_label, rolled)
                   for key, members in placement.members.items()]
    graph.edges = (rolled_edges if rolled else unrolled_edges)(history, placement)
    if history.info.is_partial:
        graph.nodes.append(Node(FAILED_KEY, failure_lines(history.info.failure), FAILED, None))
        graph.edges += failure_edges(history, placement, FAILED_KEY)
    if options.show_gradients:
        graph.edges += gradient_edges(history, placement)
    return graph


def _node(key: str, members: list[PassRecord], placement: Placement,
          modules: dict[str, ModuleRecord], by_label: dict[str, PassRecord], rolled: bool) -> Node:
    cluster = placement.cluster_of[key]
    if placement.is_module(key):
        return Node(key, _module_node_lines(key, modules, by_label, rolled), MODULE, cluster)
    first = members[0]
    lines = layer_lines(members) if rolled else pass_lines(first)
    return Node(key, lines, kind_of(first), cluster, first.is_inplace)


def _module_node_lines(key: str, modules: dict[str, ModuleRecord],
                       by_label: dict[str, PassRecord], rolled: bool) -> tuple[str, ...]:
    """`address (Type)` with its call count when rolled, output shapes and parameter count."""
    call_key = key[len(MODULE_PREFIX):]
    address, call = (call_key, None) if rolled else split_pass(call_key)
    module = modules.get(address)
    title = module_title(call_key, modules, rolled)
    if module is None:
        return module_lines(title, None, ())
    calls = module.call_outputs if rolled else module.call_outputs[call - 1:call]
    shapes = (shape_text(by_label[label].shape) for outputs in calls for label in outputs
              if label in by_label)
    return module_lines(title, module, shapes)
