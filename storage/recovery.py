"""Rebuilding the history of a log whose writer died, from the nodes stored with each activation.

While activations stream to disk, each activation's dataset gets a `nodes` attribute: the
raw nodes (what capture knows about each op before the pass ends) created since the
previous activation, as JSON. If the process dies, the metadata is never written; loading
then replays those nodes through the same labelling and loop grouping as a finished pass,
so the ops that ran get the labels they would have had had the model stopped there.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import h5py

from torchlog.assemble import assemble
from torchlog.capture import CapturedPass, ModuleInfo, RawNode
from torchlog.history import ModelHistory, RunInfo
from torchlog.records import LazyTensor, ParamInfo, TensorMeta
from torchlog.storage.format import ACTIVATIONS, MODULE_TABLE, NODE_LOG, dtype_from_name, dtype_name
from torchlog.storage.lazy import StoredValue, dataset_value
from torchlog.storage.metadata import decode, encode
from torchlog.storage.values import set_text_attrs

__all__ = ["NODES_ATTR", "NodeLog", "rebuild"]

NODES_ATTR = "nodes"
_MAX_ATTR_BYTES = 60_000  # HDF5 keeps attributes in the object header, which holds 64 KiB


class NodeLog:
    """Tags each streamed activation with the raw nodes created since the previous one."""

    def __init__(self, file: h5py.File, modules: Sequence[ModuleInfo] = ()) -> None:
        """Start the log of `file`, writing the model's module table into it first."""
        self._file = file
        table = [[m.address, m.type_name, m.num_params, list(m.children)] for m in modules]
        file.create_dataset(MODULE_TABLE, data=json.dumps(table), dtype=h5py.string_dtype())
        self._nodes: Sequence[RawNode] | None = None  # the node list of the pass being tagged
        self._num_written = 0

    def tag(self, obj: h5py.HLObject, nodes: Sequence[RawNode], index: int) -> None:
        """Store `nodes` up to and including `index` with `obj`, the activation of node `index`.

        `nodes` is capture's node list of the running pass; another list means another
        pass, which starts again from node 0. Nodes too many for an attribute go to the
        dataset NODE_LOG/<index> instead.
        """
        if nodes is not self._nodes:
            self._nodes, self._num_written = nodes, 0
        new = nodes[self._num_written:index + 1]
        text = json.dumps([self._node_dict(n) for n in new], separators=(",", ":"))
        if len(text) > _MAX_ATTR_BYTES:
            spill = self._file.require_group(NODE_LOG)
            spill.create_dataset(str(index), data=text, dtype=h5py.string_dtype())
        else:
            set_text_attrs(obj, {NODES_ATTR: text})
        self._num_written = index + 1

    def _node_dict(self, node: RawNode) -> dict[str, Any]:
        saved = node.saved
        return {
            "index": node.index, "kind": node.kind, "func_name": node.func_name,
            "parents": [[p, encode(arg)] for p, arg in node.parents],
            "params": [[p.address, list(p.shape), p.num_params, p.num_bytes] for p in node.params],
            "module_path": [list(m) for m in node.module_path],
            "output_index": node.output_index, "call_id": node.call_id,
            "meta": [list(node.meta.shape), dtype_name(node.meta.dtype), node.meta.num_bytes],
            "grad_fn_name": node.grad_fn_name, "elapsed_ns": node.elapsed_ns,
            "is_inplace": node.is_inplace, "address": node.address,
            "site": _encode_site(node.site),
            # A pass-through op shares its input's dataset.
            "shares": saved.name if isinstance(saved, StoredValue) else None,
        }


def rebuild(file: h5py.File, path: str, failure: str,
            cls: type[ModelHistory] = ModelHistory) -> ModelHistory:
    """The partial history of the ops whose nodes reached the file.

    Raises:
        ValueError, KeyError, TypeError: the stored nodes are damaged (the caller names the file).
    """
    entries = _stored_nodes(file)
    nodes = [_raw_node(d) for d in entries]
    for node in nodes:
        for parent, _ in node.parents:
            siblings = nodes[parent].children
            if not siblings or siblings[-1] != node.index:
                siblings.append(node.index)
    stored, log_id = file[ACTIVATIONS], str(file.attrs.get("log_id", ""))
    for node, entry in zip(nodes, entries):
        node.saved = _stored(stored, os.path.abspath(path), log_id, str(node.index), entry["shares"])
    # Assembled like any finished pass. What each module call returned was to come with
    # the metadata, so the rebuilt module records list no outputs.
    built = assemble(CapturedPass(tuple(nodes), _module_calls(nodes), {}, _stored_modules(file)))
    info = RunInfo(model_name=str(file.attrs.get("model_name", "unknown model")),
                   random_seed=int(file.attrs.get("random_seed", 0)), elapsed_s=0.0,
                   num_modules=len(built.modules), is_partial=True, failure=failure)
    return cls(built.passes, built.layers, built.modules, info)


def _stored_nodes(file: h5py.File) -> list[dict[str, Any]]:
    """Node entries in op order, up to the first activation the dying writer left untagged."""
    group = file.get(ACTIVATIONS)
    spilled = file.get(NODE_LOG)
    entries: list[dict[str, Any]] = []
    if group is None:
        return entries
    try:
        names: Any = sorted((n for n in group if n.isdigit()), key=int)
    except (RuntimeError, OSError, KeyError):  # killed while HDF5 updated the group's index
        names = _probed_names(group, entries)
    for name in names:
        try:
            text = group[name].attrs.get(NODES_ATTR)
            if text is None and spilled is not None and name in spilled:
                text = spilled[name].asstr()[()]
        except (RuntimeError, OSError, KeyError):  # a dataset the dying writer left half-made
            break
        if text is None:
            break
        batch = json.loads(text)
        if not batch or batch[0]["index"] != len(entries):
            break
        entries.extend(batch)
    return entries


# How far past the last recovered node an activation is looked for by name when the group's
# index cannot be listed: saved values may skip unsaved nodes (layers_to_save).
_PROBE_GAP = 10_000


def _probed_names(group: h5py.Group, entries: list) -> Iterator[str]:
    """Activation names found by looking each one up, in op order, from the first node not
    yet recovered (`entries` grows as the caller reads); stops at a gap of `_PROBE_GAP`."""
    index = len(entries)
    while True:
        for candidate in range(index, index + _PROBE_GAP):
            try:
                found = str(candidate) in group
            except (RuntimeError, OSError, KeyError):
                return
            if found:
                break
        else:
            return
        yield str(candidate)
        index = max(candidate + 1, len(entries))


def _stored_modules(file: h5py.File) -> tuple[ModuleInfo, ...]:
    """The module table written when streaming started; () in logs from before it was."""
    table = file.get(MODULE_TABLE)
    if table is None:
        return ()
    return tuple(ModuleInfo(a, t, n, tuple(c)) for a, t, n, c in json.loads(table.asstr()[()]))


def _module_calls(nodes: list[RawNode]) -> dict[str, int]:
    """How many times each module was called, as far as the nodes' module paths tell."""
    calls: dict[str, int] = {}
    for node in nodes:
        for address, call in node.module_path:
            calls[address] = max(calls.get(address, 0), call)
    return calls


def _raw_node(d: dict[str, Any]) -> RawNode:
    shape, dtype, num_bytes = d["meta"]
    node = RawNode(
        d["index"], d["kind"], d["func_name"], [(p, decode(arg)) for p, arg in d["parents"]],
        tuple(ParamInfo(a, tuple(s), n, b) for a, s, n, b in d["params"]),
        tuple((a, c) for a, c in d["module_path"]), d["output_index"], d["call_id"],
        TensorMeta(tuple(shape), dtype_from_name(dtype), num_bytes))
    node.grad_fn_name = d["grad_fn_name"]
    node.elapsed_ns = d["elapsed_ns"]
    node.is_inplace = d["is_inplace"]
    node.address = d["address"]
    node.site = _decode_site(d["site"])
    return node


class _Code(NamedTuple):
    """Stands in for the code object of a call site: equal where the code and line were, and printable."""

    co_filename: str
    co_name: str
    co_firstlineno: int
    line: int | None  # the line of the one site it stands in for

    def line_at(self, offset: int) -> int | None:
        return self.line


def _encode_site(site: Any) -> Any:
    """(code, offset) frames, and where each enclosing module was called, as JSON, each with its line."""
    def frame(f: Any) -> Any:
        return None if f is None else [f[0].co_filename, f[0].co_name, f[0].co_firstlineno, f[1],
                                       f[0].line_at(f[1])]

    return None if site is None else [frame(site[0]), [frame(f) for f in site[1]]]


def _decode_site(data: Any) -> Any:
    def frame(f: Any) -> Any:
        return None if f is None else (_Code(f[0], f[1], f[2], f[4]), f[3])

    return None if data is None else (frame(data[0]), tuple(frame(f) for f in data[1]))


def _stored(group: h5py.Group, path: str, log_id: str, name: str, shares: str | None) -> LazyTensor | None:
    """The lazy value of a node's dataset, if it was written before the writer stopped."""
    if shares is not None:
        name = shares.rpartition("/")[2]
    try:
        obj = group.get(name)
        if obj is None:
            return None
        return dataset_value(path, log_id, f"{ACTIVATIONS}/{name}", obj)
    except (RuntimeError, OSError, KeyError):  # half-made by the dying writer: not saved
        return None
