"""Assembly: turning a CapturedPass into labelled pass, layer and module records."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from torchlog.capture import CapturedPass, RawNode, site_text as _site_text
from torchlog.labels import layer_label, layer_type_of, pass_label
from torchlog.loops import group_into_layers
from torchlog.records import LayerRecord, ModuleRecord, NodeKind, ParentEdge, PassRecord

_KINDS = {kind.value: kind for kind in NodeKind}  # a raw node's kind -> the record's
_new = tuple.__new__  # ParentEdge(label, arg) without the Python-level __new__: 0.5 us less per edge
_SOURCE_TYPES = {"input": "input", "output": "output", "buffer": "buffer", "source": "tensor"}

__all__ = ["Assembled", "assemble"]


@dataclass(slots=True)
class Assembled:
    """Everything a ModelHistory is built from."""

    passes: list[PassRecord]  # execution order
    layers: list[LayerRecord]  # order of first pass
    modules: dict[str, ModuleRecord]  # address -> record, in model order


def assemble(captured: CapturedPass) -> Assembled:
    """Label every node, group passes into layers and summarise modules.

    Reads `captured` only; its nodes' saved values become the records' (not copied).
    """
    nodes = captured.nodes
    groups = group_into_layers(nodes)
    labels = _label_nodes(nodes, groups)
    passes = _pass_records(nodes, labels)
    layers = [_layer_record(members, passes) for members in groups]
    modules = _module_records(captured, labels)
    return Assembled(passes, layers, modules)


def _label_nodes(nodes: list[RawNode], groups: list[list[int]]) -> list[tuple[str, str, str, int, int]]:
    """Per node: (pass label, layer label, layer type, pass number, number of passes)."""
    type_counts: dict[str, int] = defaultdict(int)
    out: list = [None] * len(nodes)
    types = _LAYER_TYPES
    for total, members in enumerate(groups):
        first = nodes[members[0]]
        kind = _SOURCE_TYPES.get(first.kind)
        if kind:
            layer_type = kind
        else:
            layer_type = types.get(first.func_name)
            if layer_type is None:
                layer_type = types[first.func_name] = layer_type_of(first.func_name)
        type_counts[layer_type] += 1
        layer = layer_label(layer_type, type_counts[layer_type], total)
        if len(members) == 1:  # most layers: the pass label is the layer label
            out[members[0]] = (layer, layer, layer_type, 1, 1)
            continue
        for pass_num, index in enumerate(members, start=1):
            out[index] = (pass_label(layer, pass_num, len(members)), layer, layer_type,
                          pass_num, len(members))
    return out


# func_name -> layer_type_of(func_name): a few string operations per layer, cached for the process
_LAYER_TYPES: dict[str, str] = {}


def _pass_records(nodes: list[RawNode], labels: list) -> list[PassRecord]:
    """One PassRecord per node, in one loop (a call per node costs more than its body saves)."""
    names = [entry[0] for entry in labels]  # pass label per node index
    name_of = names.__getitem__
    module_texts: dict = {}  # consecutive ops share one module path tuple, and its text
    site_texts: dict[tuple, str | None] = {}
    records = []
    append = records.append
    last_path: Any = None
    containing: tuple = ()
    for node in nodes:
        index = node.index
        _, layer, layer_type, pass_num, num_passes = labels[index]
        path = node.module_path
        if path is not last_path:
            last_path = path
            containing = module_texts.get(id(path))
            if containing is None:  # the path tuples live as long as the nodes: ids stay unique
                containing = module_texts[id(path)] = tuple([_call_text(call, module_texts)
                                                             for call in reversed(path)])
        kind = node.kind
        site = node.site
        site_text = None
        if site is not None and site[0] is not None:
            innermost = site[0]
            site_text = site_texts.get(innermost)
            if site_text is None:
                site_text = site_texts[innermost] = _site_text(innermost)
        parents = node.parents
        if not parents:
            edges: tuple = ()
        elif len(parents) == 1:
            parent, arg = parents[0]
            edges = (_new(ParentEdge, (names[parent], arg)),)
        else:
            edges = tuple([_new(ParentEdge, (names[parent], arg)) for parent, arg in parents])
        # Positional, in PassRecord's field order: a third faster than keywords for 26 fields.
        append(PassRecord(
            names[index], layer, layer_type, node.func_name,
            NodeKind.CREATED if kind == "op" and not parents else _KINDS[kind],
            index, pass_num, num_passes, node.meta, node.saved,
            edges, tuple(map(name_of, node.children)),
            node.params, node.grad_fn_name, containing,
            tuple([_call_text(call, module_texts) for call in node.output_of]) if node.output_of else (),
            node.output_index, node.elapsed_ns / 1e9, node.is_inplace,
            node.address if kind == "buffer" or kind == "input" else None,
            node.func_args, node.rng_state, node.extra or {}, site_text, None,
            node.saved_for_backward_bytes, node.peak_bytes,
        ))
    return records


def _call_text(call: tuple[str, int], texts: dict) -> str:
    """'address:call' of one module call, made once per call."""
    text = texts.get(call)
    if text is None:
        text = texts[call] = f"{call[0]}:{call[1]}"
    return text


def _layer_record(members: list[int], passes: list[PassRecord]) -> LayerRecord:
    first = passes[members[0]]  # links to other layers are worked out when first read
    return LayerRecord(first.layer_label, first.layer_type, tuple([passes[i] for i in members]))


def _module_records(captured: CapturedPass, labels: list) -> dict[str, ModuleRecord]:
    calls = captured.module_calls
    outputs = captured.call_outputs
    inside: dict[tuple[str, int], list[str]] = {}
    last_path: tuple = ()
    lists: list = []
    for node in captured.nodes:
        if node.module_path is not last_path:  # consecutive ops share one path tuple
            last_path = node.module_path
            lists = [inside[call] if call in inside else inside.setdefault(call, [])
                     for call in last_path]
        label = labels[node.index][0]
        for members in lists:
            members.append(label)
    empty: tuple = ()
    records: dict[str, ModuleRecord] = {}
    for address, type_name, num_params, children, aliases in captured.modules:
        returned, computed = [], []
        for k in range(1, calls.get(address, 0) + 1):
            call = (address, k)
            nodes = outputs.get(call)
            returned.append(tuple([labels[i][0] for i in nodes]) if nodes else empty)
            members = inside.get(call)
            computed.append(tuple(members) if members else empty)
        records[address] = ModuleRecord(address, type_name, num_params, children, tuple(returned),
                                        tuple(computed), aliases)
    return records
