"""How each kind of node, edge and module box looks, and the words of the legend."""
from __future__ import annotations

from torchlog.records import NodeKind, PassRecord
from torchlog.vis.graph import (
    BUFFER, CREATED, DATA, FAILED, GRAD_FN, GRAD_LEAF, GRADIENT, INPUT, INTERVENED, MODULE, OP, OUTPUT,
    PARAM,
)

__all__ = ["FONT", "GRAPH_ATTRS", "LARGE_GRAPH_NODES", "LARGE_GRAPH_ATTRS", "NODE_DEFAULTS",
           "EDGE_DEFAULTS", "NODE_STYLES", "INPLACE_STYLE", "EDGE_STYLES", "LEGEND_ORDER",
           "LEGEND_TEXT", "INPLACE_TEXT", "GRADIENT_TEXT", "kind_of", "node_attrs",
           "cluster_attrs", "fill_of"]

FONT = "Helvetica"
GRAPH_ATTRS = {"fontname": FONT, "fontsize": "12", "labelloc": "t", "newrank": "true"}
# dot spends most of its time on x positions (network simplex), superlinearly in graph size:
# past this many nodes, cap its iterations at nslimit x nodes. Edges bend a little more, but
# a 2000-node chain lays out in ~2 s instead of minutes.
LARGE_GRAPH_NODES = 500
LARGE_GRAPH_ATTRS = {"nslimit": "0.2"}
NODE_DEFAULTS = {"shape": "box", "style": "filled", "fillcolor": "white", "fontname": FONT,
                 "fontsize": "10"}
EDGE_DEFAULTS = {"fontname": FONT, "fontsize": "8", "arrowsize": "0.7", "labelfontsize": "8",
                 "labelfontcolor": "#1F5FBF", "labeldistance": "1.8"}

# Kind -> DOT attributes: colour tells kinds apart, shape and line style back it up in print.
NODE_STYLES: dict[str, dict[str, str]] = {
    INPUT: {"shape": "oval", "fillcolor": "#98FB98"},
    OUTPUT: {"shape": "oval", "fillcolor": "#FF9999"},
    PARAM: {"fillcolor": "#D3D3D3"},
    BUFFER: {"style": "filled,dashed", "fillcolor": "#FFF2AE"},
    CREATED: {"style": "filled,rounded", "fillcolor": "#CFE8FF"},
    OP: {},
    MODULE: {"shape": "box3d", "fillcolor": "#E8E0F5"},
    FAILED: {"shape": "octagon", "fillcolor": "#E03030", "fontcolor": "white", "color": "#8B0000"},
    INTERVENED: {"shape": "hexagon", "fillcolor": "#FFC04D", "color": "#B35900", "penwidth": "2"},
    GRAD_FN: {"fillcolor": "#D3D3D3"},  # torchviz's colours for autograd nodes and leaves
    GRAD_LEAF: {"fillcolor": "#ADD8E6"},
}
INPLACE_STYLE = {"peripheries": "2"}
EDGE_STYLES: dict[str, dict[str, str]] = {
    DATA: {},
    # Gradients run against the data flow, so they must not pull the layout around.
    GRADIENT: {"color": "#7B2FBE", "fontcolor": "#7B2FBE", "style": "dashed", "constraint": "false"},
}
LEGEND_ORDER = (INPUT, OUTPUT, PARAM, OP, BUFFER, CREATED, MODULE, FAILED, INTERVENED, GRAD_FN, GRAD_LEAF)
LEGEND_TEXT = {
    INPUT: "input", OUTPUT: "output", PARAM: "parameter op", OP: "op",
    BUFFER: "buffer (dashed)", CREATED: "created in forward (rounded)",
    MODULE: "collapsed module", FAILED: "op that raised", INTERVENED: "intervened (hexagon)",
    GRAD_FN: "autograd node (grad_fn)", GRAD_LEAF: "parameter (AccumulateGrad)",
}
INPLACE_TEXT = "in-place (double border)"
GRADIENT_TEXT = "gradient (dashed purple)"


# A record's kind -> its node kind; ops split further into parameter ops and plain ops.
_KIND_OF = {NodeKind.INPUT: INPUT, NodeKind.OUTPUT: OUTPUT, NodeKind.BUFFER: BUFFER,
            NodeKind.CREATED: CREATED, NodeKind.SOURCE: CREATED}


def kind_of(record: PassRecord) -> str:
    """The node kind of a pass: intervened, input, output, buffer, created, parameter op or plain op."""
    if "interventions" in record.extra:
        return INTERVENED
    kind = _KIND_OF.get(record.kind)
    if kind is not None:
        return kind
    return PARAM if record.params else OP


def node_attrs(kind: str, is_inplace: bool) -> dict[str, str]:
    """DOT attributes of a node beyond the defaults (its label is added by the writer)."""
    attrs = dict(NODE_STYLES[kind])
    if is_inplace:
        attrs.update(INPLACE_STYLE)
    return attrs


def cluster_attrs(depth: int, rankdir: str) -> dict[str, str]:
    """Module boxes: rounded, outer ones drawn heavier so the nesting reads at a glance.

    The title goes on the side where the box starts reading: graphviz flips `labelloc`
    with a bottom-up rankdir, so 'b' puts it on top there.
    """
    penwidth = max(1.0, 3.0 - 0.5 * depth)
    return {"style": "rounded", "penwidth": f"{penwidth:.1f}", "fontsize": "10", "labeljust": "l",
            "labelloc": "b" if rankdir == "BT" else "t"}


def fill_of(kind: str) -> str:
    """The fill colour of a kind, for the legend swatches."""
    return NODE_STYLES[kind].get("fillcolor", NODE_DEFAULTS["fillcolor"])
