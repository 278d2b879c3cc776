"""The data an interactive page is built from: passes, layers, module calls and statistics.

Everything here is plain JSON-ready Python (str, int, float, list, dict), computed once
from a finished ModelHistory; the page decides what to draw from it. Whole tensors never
go into the page, only their statistics.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from torchlog.capture import FUNCTIONAL_KEY
from torchlog.labels import split_pass
from torchlog.records import LayerRecord, ModuleRecord, PassRecord
from torchlog.vis.edges import args_between, shows_arg
from torchlog.vis.graph import BUFFER, CREATED, FAILED, INPUT, INTERVENED, MODULE, OP, OUTPUT, PARAM
from torchlog.vis.placement import module_title
from torchlog.vis.style import (
    EDGE_DEFAULTS, GRAPH_ATTRS, INPLACE_STYLE, LARGE_GRAPH_ATTRS, LARGE_GRAPH_NODES, LEGEND_ORDER,
    LEGEND_TEXT, NODE_DEFAULTS, NODE_STYLES, kind_of,
)
from torchlog.vis.text import (
    MAX_SHAPES_SHOWN, arg_text, caption_lines, layer_lines, pass_lines, passes_text,
    shape_text,
)
from torchlog.vis.viewer.failure import failure_entry
from torchlog.vis.viewer.heatmap import acted_heatmap, heatmaps
from torchlog.vis.viewer.outputs import call_lines, call_outputs
from torchlog.vis.viewer.plumbing import PlumbingScope, plumbing_scopes
from torchlog.vis.viewer.sites import site_entry
from torchlog.vis.viewer.stats import tensor_stats_all

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["FORMAT_VERSION", "page_data"]

FORMAT_VERSION = 1
# Bytes of heatmap cells a page holds at most (base64): 1,000 32x32 pictures.
HEAT_BUDGET = 1_400_000


def page_data(history: "ModelHistory", mode: str, depth: int | None,
              with_stats: bool = True) -> dict[str, Any]:
    """Everything the page needs about `history`, and the view it opens with.

    Example:
        >>> import torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.Linear(3, 2), torch.ones(1, 3), random_seed=0)
        >>> data = page_data(h, "unrolled", None)
        >>> [p["label"] for p in data["passes"]], data["passes"][1]["kind"]
        (['input_1_0', 'linear_1_1', 'output_1_2'], 'param')
    """
    layers = {layer.label: layer for layer in history.layers}
    stats = _all_stats(history) if with_stats else {}
    scopes, plumbing = scope_table(history)
    passes = [_pass_entry(r, stats.get(r.label), scopes[r.label]) for r in history]
    _join_outputs(history, passes, layers)
    if with_stats:
        _acted(history, passes)
    return {
        "version": FORMAT_VERSION,
        "model": history.model_name,
        "caption": list(caption_lines(history)),
        "view": {"mode": mode, "depth": depth},
        "passes": passes,
        "layers": [_layer_entry(layer, layers) for layer in history.layers],
        "calls": (calls := _module_calls(history, scopes, plumbing)),
        "modules": _modules(history, calls, plumbing),
        "failure": failure_entry(history),
        "numSaved": sum(1 for r in history if r.has_saved_tensor),  # 0: no statistics to show
        "dot": _dot_styles(),
    }


def _join_outputs(history: "ModelHistory", passes: list[dict[str, Any]],
                  layers: dict[str, LayerRecord]) -> None:
    """Mark the passes of a call that returned several tensors: the first lists them all
    (`outputs`) with the call's node lines, the others name it (`callOf`)."""
    entries = {entry["label"]: entry for entry in passes}
    by_label = {r.label: r for r in history}
    for first, labels in call_outputs(history).items():
        records = [by_label[label] for label in labels]
        entries[first]["outputs"] = list(labels)
        entries[first]["callLines"] = call_lines(records)
        layer = layers.get(records[0].layer_label)
        if layer is not None:
            entries[first]["layerCallLines"] = call_lines(records, list(layer.passes))
        for label in labels[1:]:
            entries[label]["callOf"] = first


def _acted(history: "ModelHistory", passes: list[dict[str, Any]]) -> None:
    """Give each saved intervened pass the slice its first action acted on, before and after
    (`acted`: see heatmap.acted_heatmap)."""
    for record, entry in zip(history, passes):
        marks = record.extra.get("interventions", ())
        before = marks[0].get("before") if marks else None
        if before and record.saved is not None:
            acted = acted_heatmap(record.tensor_contents, before)
            if acted is not None:
                entry["acted"] = acted


def _dot_styles() -> dict[str, Any]:
    """The graphviz view's look, so both views draw each kind the same way."""
    kinds = (INPUT, OUTPUT, PARAM, BUFFER, CREATED, OP, MODULE, FAILED, INTERVENED)
    return {"graph": dict(GRAPH_ATTRS), "node": dict(NODE_DEFAULTS), "edge": dict(EDGE_DEFAULTS),
            "kinds": {kind: dict(NODE_STYLES[kind]) for kind in kinds},
            "legend": {kind: LEGEND_TEXT[kind] for kind in LEGEND_ORDER if kind in kinds},
            "inplace": dict(INPLACE_STYLE), "large": dict(LARGE_GRAPH_ATTRS),
            "largeNodes": LARGE_GRAPH_NODES}


@contextmanager
def _one_thread() -> Iterator[None]:
    """Statistics of many small tensors: one thread is several times faster than a pool
    that has to wake up per call (and much faster on a busy machine); restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def scope_table(history: "ModelHistory") -> tuple[dict[str, tuple[str, ...]], dict[str, PlumbingScope]]:
    """Each pass's scopes, innermost first (the helper run or fold of an op that carries no
    data, then functional and module calls), and the plumbing scopes by key."""
    scopes = {r.label: _scopes(r) for r in history}
    plumbing = {s.key: s for s in plumbing_scopes(history, scopes)}
    for scope in plumbing.values():
        for label in scope.members:
            scopes[label] = (scope.key, *scopes[label])
    return scopes, plumbing


def _pass_entry(record: PassRecord, stats: dict[str, Any] | None,
                scopes: tuple[str, ...]) -> dict[str, Any]:
    """What the page knows of one pass; fields that are empty or false are left out, which
    keeps a 20,000-op page a third smaller."""
    entry: dict[str, Any] = {
        "label": record.label,
        "lines": list(pass_lines(record)),
        "layer": record.layer_label,
        "type": record.layer_type,
        "func": record.func_name,
        "kind": kind_of(record),
        "pass": record.pass_num,
        "npasses": record.num_passes,
        "shape": list(record.shape),
        "dtype": str(record.dtype).removeprefix("torch."),
        "bytes": record.num_bytes,
        "modules": list(scopes),
        "site": site_entry(record.call_site),
        "timeUs": round(record.elapsed_s * 1e6, 1),
        "parents": [[e.label, arg_text(e.arg)] for e in record.parents],
        "children": list(record.children),
        "saved": record.has_saved_tensor,
    }
    optional = {
        "inplace": record.is_inplace,
        "showArg": shows_arg(record),
        "outputOf": list(record.output_of_modules),
        "params": [[p.address, list(p.shape), p.num_params] for p in record.params],
        "address": record.buffer_address,
        "stats": stats,
        "interventions": [f"{mark['action']} at site {mark['site']!r}, max |change| "
                          f"{'nan' if mark['max_abs_change'] is None else format(mark['max_abs_change'], '.4g')}"
                          for mark in record.extra.get("interventions", ())],
        # the value before the first action at this pass: the panel sets it beside the saved
        # one (the acted-on slice's cell means go to `acted`, see _acted)
        "before": {key: value for key, value in (next(iter(record.extra.get("interventions", ())), {})
                                                 .get("before") or {}).items() if key != "plane"},
    }
    entry.update((key, value) for key, value in optional.items() if value)
    if record.has_grad:
        grad = record.grad_contents
        entry["grad"] = {"shape": list(grad.shape), "norm": float(grad.double().norm())}
    return entry


def _all_stats(history: "ModelHistory") -> dict[str, dict[str, Any]]:
    """Statistics of every saved value by pass label, all computed together, with a heatmap
    (`heat`) while they fit in HEAT_BUDGET; a value shared by passes is summarised once."""
    values: dict[int, Any] = {}
    for record in history:
        if record.saved is not None:
            values.setdefault(id(record.saved), record.tensor_contents)
    with _one_thread():
        found = dict(zip(values, tensor_stats_all(list(values.values()))))
        for key, heat in heatmaps(values, HEAT_BUDGET).items():
            if found[key] is not None:
                found[key]["heat"] = heat
    return {r.label: found[id(r.saved)] for r in history
            if r.saved is not None and found[id(r.saved)] is not None}


def _layer_entry(layer: LayerRecord, layers: dict[str, LayerRecord]) -> dict[str, Any]:
    """A rolled node and its incoming edges, with the passes and argument slots each links."""
    parents = []
    for parent_label, span in layer.parent_layers.items():
        parent = layers.get(parent_label)
        args = args_between(parent, layer, span.child_passes) if parent is not None else []
        parents.append({"layer": parent_label, "out": passes_text(span.parent_passes),
                        "in": passes_text(span.child_passes), "args": [arg_text(a) for a in args]})
    return {"label": layer.label, "type": layer.layer_type, "lines": list(layer_lines(layer.passes)),
            "passes": [r.label for r in layer.passes], "parents": parents}


def _module_calls(history: "ModelHistory", scopes: dict[str, tuple[str, ...]],
                  plumbing: dict[str, PlumbingScope]) -> dict[str, dict[str, Any]]:
    """One entry per module call ('block.attn:2'): what it is, holds, reads and returns."""
    modules = history.modules
    by_label = {r.label: r for r in history}
    members: dict[str, set[str]] = {}
    calls: dict[str, dict[str, Any]] = {}
    for record in history:
        chain = tuple(reversed(scopes[record.label]))
        for depth, call in enumerate(chain, start=1):
            members.setdefault(call, set()).add(record.label)
            if call not in calls:
                address, num = split_pass(call)
                calls[call] = {"address": address, "call": num, "depth": depth,
                               "parent": chain[depth - 2] if depth > 1 else None}
    for call, entry in calls.items():
        module = modules.get(entry["address"])
        inside = members[call]
        entry["kind"] = "module" if module else plumbing[call].kind if call in plumbing else "functional"
        entry["inputs"] = _outside_parents(inside, by_label)
        returned = _returned(module, entry["call"]) if module else _leaving(inside, by_label)
        entry["outputs"] = _shapes_of(returned, by_label)
        title = module_title(call, modules, False) if module else \
            plumbing[call].title if call in plumbing else f"{call} (functional)"
        entry["lines"] = _box_lines(title, module, entry["inputs"], entry["outputs"])
    return calls


def _scopes(record: PassRecord) -> tuple[str, ...]:
    """The module calls and Python-functional calls an op ran in, innermost first.

    A functional such as `F.multi_head_attention_forward` is not a module, but its ops are
    drawn in a box of their own like a module call's ('attn.multi_head_attention_forward:1').
    """
    return tuple(record.extra.get(FUNCTIONAL_KEY, ())) + record.containing_modules


def _leaving(inside: set[str], by_label: dict[str, PassRecord]) -> tuple[str, ...]:
    """The ops of a functional call whose values are used outside it: what it returned."""
    return tuple(label for label in sorted(inside, key=lambda l: by_label[l].op_index)
                 if any(child not in inside for child in by_label[label].children))


def _returned(module: ModuleRecord | None, call: int | None) -> tuple[str, ...]:
    if module is None or call is None or not 1 <= call <= len(module.call_outputs):
        return ()
    return module.call_outputs[call - 1]


def _outside_parents(inside: set[str], by_label: dict[str, PassRecord]) -> list[list[int]]:
    """Shapes of the tensors that ops inside a call read from outside it, in first-use order."""
    seen: dict[str, None] = {}
    for label in sorted(inside, key=lambda l: by_label[l].op_index):
        for edge in by_label[label].parents:
            if edge.label not in inside and not by_label[edge.label].is_buffer:
                seen.setdefault(edge.label, None)
    return [list(by_label[l].shape) for l in seen]


def _shapes_of(labels: tuple[str, ...], by_label: dict[str, PassRecord]) -> list[list[int]]:
    return [list(by_label[l].shape) for l in labels if l in by_label]


def _modules(history: "ModelHistory", calls: dict[str, dict[str, Any]],
             plumbing: dict[str, PlumbingScope]) -> dict[str, dict[str, Any]]:
    """One entry per module address, its calls taken together: the rolled view's module
    nodes and boxes, and the panel of a collapsed module."""
    modules = history.modules
    by_address: dict[str, list[dict[str, Any]]] = {}
    for entry in calls.values():
        by_address.setdefault(entry["address"], []).append(entry)
    entries: dict[str, dict[str, Any]] = {}
    for address in [*modules, *(a for a in by_address if a not in modules)]:
        module, own = modules.get(address), by_address.get(address, [])
        inputs = [shape for entry in own for shape in entry["inputs"]]
        outputs = [shape for entry in own for shape in entry["outputs"]]
        if module is not None:
            facts = {"type": module.type_name, "params": module.num_params,
                     "calls": module.num_passes, "children": list(module.children)}
            title = module_title(address, modules, True)
        else:  # a Python functional's calls, or plumbing
            kind = own[0]["kind"]
            facts = {"type": kind, "params": 0, "calls": len(own), "children": []}
            first = plumbing.get(f"{address}:1")
            title = first.title if first else f"{address} (functional)"
            title += f" x{len(own)}" if len(own) > 1 else ""
        facts["kind"] = "module" if module is not None else facts["type"]
        entries[address] = {**facts, "inputs": _distinct(inputs), "outputs": _distinct(outputs),
                            "lines": _box_lines(title, module, inputs, outputs)}
    return entries


def _distinct(shapes: list[list[int]]) -> list[list[int]]:
    return [list(s) for s in dict.fromkeys(tuple(s) for s in shapes)]


def _box_lines(title: str, module: ModuleRecord | None, inputs: list[list[int]],
               outputs: list[list[int]]) -> list[str]:
    """A collapsed module's node: `address (Type)`, what goes in and out, its parameters."""
    lines = [title]
    for word, shapes in (("in", inputs), ("out", outputs)):
        texts = [shape_text(s) for s in _distinct(shapes)]
        if texts:
            more = f" +{len(texts) - MAX_SHAPES_SHOWN} more" if len(texts) > MAX_SHAPES_SHOWN else ""
            lines.append(f"{word}: " + ", ".join(texts[:MAX_SHAPES_SHOWN]) + more)
    if module is not None and module.num_params:
        lines.append(f"params: {module.num_params:,}")
    return lines
