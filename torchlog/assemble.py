"""Assembly: turning a CapturedPass into labelled pass, layer and module records."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from torchlog.capture.captured import CapturedPass
from torchlog.capture.nodes import RawNode
from torchlog.labels import layer_label, layer_type_of, pass_label
from torchlog.loops import group_into_layers
from torchlog.records import LayerRecord, ModuleRecord, NodeKind, ParentEdge, PassRecord, PassSpan

_KINDS = {kind.value: kind for kind in NodeKind}  # a raw node's kind -> the record's
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
    module_texts: dict[int, tuple[str, ...]] = {}  # consecutive ops share one module path
    passes = [_pass_record(node, labels, module_texts) for node in nodes]
    by_label = {p.label: p for p in passes}
    layers = [_layer_record(members, passes, by_label) for members in groups]
    modules = _module_records(captured, labels)
    return Assembled(passes, layers, modules)


def _label_nodes(nodes: list[RawNode], groups: list[list[int]]) -> list[tuple[str, str, str, int, int]]:
    """Per node: (pass label, layer label, layer type, pass number, number of passes)."""
    type_counts: dict[str, int] = defaultdict(int)
    out: list = [None] * len(nodes)
    for total, members in enumerate(groups):
        first = nodes[members[0]]
        kind = _SOURCE_TYPES.get(first.kind)
        layer_type = kind if kind else layer_type_of(first.func_name)
        type_counts[layer_type] += 1
        layer = layer_label(layer_type, type_counts[layer_type], total)
        for pass_num, index in enumerate(members, start=1):
            out[index] = (pass_label(layer, pass_num, len(members)), layer, layer_type,
                          pass_num, len(members))
    return out


def _pass_record(node: RawNode, labels: list, module_texts: dict[int, tuple[str, ...]]) -> PassRecord:
    label, layer, layer_type, pass_num, num_passes = labels[node.index]
    path = node.module_path
    containing = module_texts.get(id(path))
    if containing is None:  # the path tuples live as long as the nodes: ids stay unique
        containing = module_texts[id(path)] = tuple(f"{a}:{c}" for a, c in reversed(path))
    kind = node.kind
    record = PassRecord(
        label=label,
        layer_label=layer,
        layer_type=layer_type,
        func_name=node.func_name,
        kind=NodeKind.CREATED if kind == "op" and not node.parents else _KINDS[kind],
        op_index=node.index,
        pass_num=pass_num,
        num_passes=num_passes,
        tensor_meta=node.meta,
        saved=node.saved,
        parents=tuple(ParentEdge(labels[p][0], arg) for p, arg in node.parents),
        children=tuple(labels[c][0] for c in node.children),
        params=node.params,
        grad_fn_name=node.grad_fn_name,
        containing_modules=containing,
        output_of_modules=tuple(f"{a}:{c}" for a, c in node.output_of) if node.output_of else (),
        output_index=node.output_index,
        elapsed_s=node.elapsed_ns / 1e9,
        is_inplace=node.is_inplace,
        buffer_address=node.address if kind in ("buffer", "input") else None,
        func_args=node.func_args,
        rng_state=node.rng_state,
        extra=node.extra or {},
        call_site=_site_text(node.site),
        saved_for_backward_bytes=node.saved_for_backward_bytes,
        peak_bytes=node.peak_bytes,
    )
    return record


def _site_text(site: tuple | None) -> str | None:
    if site is None:
        return None
    innermost = site[0]
    if innermost is None:
        return None
    code, _, line = innermost
    return f"{code.co_filename}:{line} in {code.co_name}"


def _layer_record(members: list[int], passes: list[PassRecord],
                  by_label: dict[str, PassRecord]) -> LayerRecord:
    layer_passes = tuple(passes[i] for i in members)
    parent_links: dict[str, tuple[list[int], list[int]]] = {}
    child_links: dict[str, tuple[list[int], list[int]]] = {}
    for record in layer_passes:
        for parent_label in record.parent_labels:
            parent = by_label[parent_label]
            span = parent_links.setdefault(parent.layer_label, ([], []))
            span[0].append(parent.pass_num)
            span[1].append(record.pass_num)
        for child_label in record.children:
            child = by_label[child_label]
            span = child_links.setdefault(child.layer_label, ([], []))
            span[0].append(record.pass_num)
            span[1].append(child.pass_num)
    first = layer_passes[0]
    return LayerRecord(
        label=first.layer_label,
        layer_type=first.layer_type,
        passes=layer_passes,
        parent_layers={k: PassSpan(tuple(a), tuple(b)) for k, (a, b) in parent_links.items()},
        child_layers={k: PassSpan(tuple(a), tuple(b)) for k, (a, b) in child_links.items()},
    )


def _module_records(captured: CapturedPass, labels: list) -> dict[str, ModuleRecord]:
    calls = captured.module_calls
    outputs = {call: [labels[i][0] for i in nodes] for call, nodes in captured.call_outputs.items()}
    inside: dict[tuple[str, int], list[str]] = defaultdict(list)
    last_path: tuple = ()
    lists: list = []
    for node in captured.nodes:
        if node.module_path is not last_path:  # consecutive ops share one path tuple
            last_path = node.module_path
            lists = [inside[call] for call in last_path]
        label = labels[node.index][0]
        for members in lists:
            members.append(label)
    records: dict[str, ModuleRecord] = {}
    for module in captured.modules:
        address = module.address
        n = calls.get(address, 0)
        records[address] = ModuleRecord(
            address=address,
            type_name=module.type_name,
            num_params=module.num_params,
            children=module.children,
            call_outputs=tuple(tuple(outputs.get((address, k), ())) for k in range(1, n + 1)),
            call_layers=tuple(tuple(inside[(address, k)]) for k in range(1, n + 1)),
            aliases=module.aliases,
        )
    return records
