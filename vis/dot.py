"""Write a VisGraph as DOT source text: pure string building, no graphviz needed."""
from __future__ import annotations

from collections.abc import Iterable

from torchlog.vis.graph import GRADIENT, Cluster, Edge, Node, VisGraph
from torchlog.vis.style import (
    EDGE_DEFAULTS, EDGE_STYLES, GRADIENT_TEXT, GRAPH_ATTRS, INPLACE_TEXT, LARGE_GRAPH_ATTRS,
    LARGE_GRAPH_NODES, LEGEND_ORDER, LEGEND_TEXT, NODE_DEFAULTS, cluster_attrs, fill_of, node_attrs,
)

__all__ = ["Html", "quote", "html_escape", "attr_list", "dot_source", "legend_html"]

_INDENT = "  "


class Html(str):
    """A graphviz HTML-like label, written between `<` and `>` instead of quotes."""


def quote(text: str) -> str:
    """A DOT quoted string; newlines become centred line breaks.

    Example:
        >>> print(quote('a "b"\\nc'))
        "a \\"b\\"\\nc"
    """
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def html_escape(text: str) -> str:
    """Escape text for an HTML-like label."""
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def attr_list(attrs: dict[str, str]) -> str:
    """`[a="1", b=<...>]` in insertion order; empty when there is nothing to set."""
    if not attrs:
        return ""
    parts = [f"{k}=<{v}>" if isinstance(v, Html) else f"{k}={quote(v)}" for k, v in attrs.items()]
    return " [" + ", ".join(parts) + "]"


def dot_source(graph: VisGraph) -> str:
    """The complete DOT text of `graph`; equal graphs give byte-identical text."""
    lines = [f"digraph {quote(graph.name)} {{"]
    graph_attrs = {"rankdir": graph.rankdir, **GRAPH_ATTRS}
    if len(graph.nodes) > LARGE_GRAPH_NODES:
        graph_attrs.update(LARGE_GRAPH_ATTRS)
    if graph.caption:
        graph_attrs["label"] = legend_html(graph)
    lines.append(f"{_INDENT}graph{attr_list(graph_attrs)}")
    lines.append(f"{_INDENT}node{attr_list(NODE_DEFAULTS)}")
    lines.append(f"{_INDENT}edge{attr_list(EDGE_DEFAULTS)}")
    lines += _body(graph)
    lines += [f"{_INDENT}{_edge_line(edge)}" for edge in graph.edges]
    lines.append("}")
    return "\n".join(lines) + "\n"


def _body(graph: VisGraph) -> list[str]:
    """Nodes in execution order, each module box written where its first node falls."""
    items: dict[str | None, list[Node | Cluster]] = {None: []}
    for node in graph.nodes:
        items[None if node.cluster is None else _open_box(node.cluster, graph.clusters, items)] \
            .append(node)
    return _block(None, items, 1, graph.rankdir)


def _open_box(key: str, clusters: dict[str, Cluster],
              items: dict[str | None, list[Node | Cluster]]) -> str:
    """Register box `key` and its enclosing boxes on first sight; return `key`."""
    if key not in items:
        items[key] = []
        parent = clusters[key].parent
        items[None if parent is None else _open_box(parent, clusters, items)].append(clusters[key])
    return key


def _block(key: str | None, items: dict[str | None, list[Node | Cluster]], level: int,
           rankdir: str) -> list[str]:
    pad = _INDENT * level
    lines: list[str] = []
    for item in items.get(key, ()):
        if isinstance(item, Node):
            lines.append(f"{pad}{_node_line(item)}")
            continue
        lines.append(f"{pad}subgraph {quote('cluster_' + item.key)} {{")
        attrs = {"label": item.label, **cluster_attrs(item.depth, rankdir)}
        lines.append(f"{pad}{_INDENT}graph{attr_list(attrs)}")
        lines += _block(item.key, items, level + 1, rankdir)
        lines.append(f"{pad}}}")
    return lines


def _node_line(node: Node) -> str:
    attrs = {"label": "\n".join(node.lines), **node_attrs(node.kind, node.is_inplace)}
    return f"{quote(node.key)}{attr_list(attrs)}"


def _edge_line(edge: Edge) -> str:
    attrs = {name: value for name, value in (("label", edge.label), ("taillabel", edge.taillabel),
                                             ("headlabel", edge.headlabel)) if value}
    attrs.update(EDGE_STYLES[edge.kind])
    return f"{quote(edge.tail)} -> {quote(edge.head)}{attr_list(attrs)}"


def legend_html(graph: VisGraph) -> Html:
    """The caption lines over one row of swatches for the node kinds this graph uses."""
    swatches = _swatches(graph.nodes, graph.edges)
    span = f' COLSPAN="{len(swatches)}"' if len(swatches) > 1 else ""
    title, *facts = graph.caption
    rows = [f"<TR><TD{span}><B>{html_escape(title)}</B></TD></TR>"]
    rows += [f"<TR><TD{span}>{html_escape(line)}</TD></TR>" for line in facts]
    cells = "".join(f'<TD BORDER="1" BGCOLOR="{color}">{html_escape(text)}</TD>'
                    for color, text in swatches)
    if cells:
        rows.append(f"<TR>{cells}</TR>")
    return Html(f'<TABLE BORDER="0" CELLSPACING="3" CELLPADDING="3">{"".join(rows)}</TABLE>')


def _swatches(nodes: Iterable[Node], edges: Iterable[Edge]) -> list[tuple[str, str]]:
    nodes = list(nodes)
    kinds = {node.kind for node in nodes}
    swatches = [(fill_of(kind), LEGEND_TEXT[kind]) for kind in LEGEND_ORDER if kind in kinds]
    if any(node.is_inplace for node in nodes):
        swatches.append(("white", INPLACE_TEXT))
    if any(edge.kind == GRADIENT for edge in edges):
        swatches.append(("white", GRADIENT_TEXT))
    return swatches
