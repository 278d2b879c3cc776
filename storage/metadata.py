"""A ModelHistory's records as JSON, and back: everything but the tensors themselves.

Records are encoded field by field, so a field added to PassRecord is stored without
changes here. JSON arrays decode as tuples (every sequence in the records is a tuple);
lists, non-str-keyed dicts and dtypes inside `extra` are tagged so they come back as
they were. Values JSON cannot hold (functions, objects) are stored as their repr.
Saved tensors appear as references made by the caller (`{"ref": "activations/12", ...}`).
Files written before PassRecord.kind and the typed RunInfo fields existed (flags
`is_input`..., `RunInfo.extra["save_gradients"]`) are read into the new fields.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import torch

from torchlog.history import ModelHistory, RunInfo, all_passes
from torchlog.interventions.records import InterventionRecord
from torchlog.records import (
    FailedArg, FailedOp, LayerRecord, ModuleRecord, NodeKind, ParamInfo, ParentEdge, PassRecord,
    PassSpan, TensorMeta,
)
from torchlog.storage.format import dtype_from_name, dtype_name

__all__ = ["TENSOR_FIELDS", "encode", "decode", "history_to_json", "history_from_json"]

# PassRecord fields that refer to tensors kept as datasets, not JSON.
TENSOR_FIELDS = ("saved", "grad_saved", "rng_state")
# Fields stored under their public name, as files have always named them.
_STORED_NAMES = {"grad_saved": "grad_contents"}
_FIELD_NAMES = {stored: field for field, stored in _STORED_NAMES.items()}
# Fields that hold live code (func_args: functions and tensors).
_SKIPPED = {"func_args"}
# Flags older files store instead of `kind`, each naming the kind it stood for.
_OLD_KIND_FLAGS = {f"is_{kind.value}": kind for kind in NodeKind if kind is not NodeKind.OP}

Ref = Callable[[str, PassRecord, Any], Any]  # (field, record, value) -> reference, or None


def encode(value: Any) -> Any:
    """A JSON-able form of `value` that `decode` turns back into it."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tuple):
        return [encode(v) for v in value]
    if isinstance(value, list):
        return {"__list__": [encode(v) for v in value]}
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: encode(v) for k, v in value.items()}
        return {"__dict__": [[encode(k), encode(v)] for k, v in value.items()]}
    if isinstance(value, torch.dtype):
        return {"__dtype__": dtype_name(value)}
    return {"__repr__": repr(value)}


def decode(value: Any) -> Any:
    """Invert `encode` (reprs stay strings)."""
    if isinstance(value, list):
        return tuple(decode(v) for v in value)
    if not isinstance(value, dict):
        return value
    if "__list__" in value:
        return [decode(v) for v in value["__list__"]]
    if "__dict__" in value:
        return {_hashable(decode(k)): decode(v) for k, v in value["__dict__"]}
    if "__dtype__" in value:
        return dtype_from_name(value["__dtype__"])
    if "__repr__" in value:
        return value["__repr__"]
    return {k: decode(v) for k, v in value.items()}


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


# ----- history -> JSON ----------------------------------------------------------------------------
def history_to_json(history: ModelHistory, ref: Ref) -> str:
    """Describe `history` as JSON; `ref` gives what to store for each tensor field."""
    everything = all_passes(history)
    visible = history.layer_labels
    doc = {
        "passes": [_pass_to_dict(p, ref) for p in everything],
        "visible": None if len(visible) == len(everything) else visible,
        "layers": [_layer_to_dict(layer) for layer in history.layers],
        "modules": [encode(dataclasses.asdict(m)) for m in history.modules.values()],
        "info": _info_to_dict(history.info),
        "has_all_passes": history.info.all_passes is not None,
    }
    return json.dumps(doc, separators=(",", ":"))


def _pass_to_dict(record: PassRecord, ref: Ref) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(PassRecord):
        value = getattr(record, f.name)
        if f.name in _SKIPPED:
            continue
        if f.name in TENSOR_FIELDS:
            out[_STORED_NAMES.get(f.name, f.name)] = None if value is None else ref(f.name, record, value)
        elif f.name == "tensor_meta":
            out[f.name] = [list(value.shape), dtype_name(value.dtype), value.num_bytes]
        elif f.name == "kind":
            out[f.name] = str(value)
        else:
            out[f.name] = encode(value)
    return out


def _layer_to_dict(layer: LayerRecord) -> dict[str, Any]:
    return {
        "label": layer.label,
        "layer_type": layer.layer_type,
        "passes": [p.label for p in layer.passes],
        "parent_layers": [[k, list(s.parent_passes), list(s.child_passes)] for k, s in layer.parent_layers.items()],
        "child_layers": [[k, list(s.parent_passes), list(s.child_passes)] for k, s in layer.child_layers.items()],
    }


def _info_to_dict(info: RunInfo) -> dict[str, Any]:
    # all_passes: the passes themselves; interventions and failed_op: below
    found = {f.name: encode(getattr(info, f.name)) for f in dataclasses.fields(RunInfo)
             if f.name not in ("all_passes", "interventions", "failed_op")}
    found["failed_op"] = _failed_op_to_dict(info.failed_op)
    # Interventions as plain data: site and action as text, parameters as JSON (no code).
    found["interventions"] = [record.as_json() for record in info.interventions]
    return found


# ----- JSON -> history ----------------------------------------------------------------------------
def history_from_json(text: str, load_ref: Callable[[str, dict], Any],
                      cls: type[ModelHistory] = ModelHistory) -> ModelHistory:
    """Rebuild the history `history_to_json` described, as a `cls`.

    `load_ref(field, reference)` turns each stored reference into the value the record holds.

    Raises:
        ValueError, KeyError, TypeError: the JSON does not describe a history (the
            caller turns these into a LogFileError naming the file).
    """
    doc = json.loads(text)
    passes = [_pass_from_dict(d, load_ref) for d in doc["passes"]]
    by_label = {p.label: p for p in passes}
    visible = passes if doc["visible"] is None else [by_label[label] for label in doc["visible"]]
    layers = [_layer_from_dict(d, by_label) for d in doc["layers"]]
    modules = {d["address"]: ModuleRecord(**_known(ModuleRecord, decode(d))) for d in doc["modules"]}
    info = _info_from_dict({k: decode(v) for k, v in doc["info"].items()})
    if doc["has_all_passes"]:
        info.all_passes = passes
    return cls(visible, layers, modules, info)


def _info_from_dict(fields: dict[str, Any]) -> RunInfo:
    """RunInfo from its stored fields; older files kept the gradient hook count in `extra`."""
    extra = fields.get("extra") or {}
    if "num_gradient_hooks" not in fields and "save_gradients" in extra:
        fields["num_gradient_hooks"] = extra["save_gradients"]
    fields["interventions"] = tuple(_intervention(d) for d in fields.get("interventions") or ())
    fields["failed_op"] = _failed_op_from_dict(fields.get("failed_op"))
    return RunInfo(**_known(RunInfo, fields))


def _failed_op_to_dict(op: FailedOp | None) -> dict[str, Any] | None:
    """The call that raised as plain JSON: each argument as [slot, shape, dtype name, source]."""
    if op is None:
        return None
    args = [[encode(a.arg), None if a.shape is None else list(a.shape), dtype_name(a.dtype), a.source]
            for a in op.args]
    return {"func_name": op.func_name, "call_site": op.call_site, "source_line": op.source_line,
            "args": args}


def _failed_op_from_dict(d: dict[str, Any] | None) -> FailedOp | None:
    """Invert `_failed_op_to_dict` on a decoded entry (its arrays are tuples by now)."""
    if d is None:
        return None
    args = tuple(FailedArg(arg, shape, dtype_from_name(dtype), source)
                 for arg, shape, dtype, source in d["args"])
    return FailedOp(d["func_name"], d["call_site"], d["source_line"], args)


def _intervention(d: dict[str, Any]) -> InterventionRecord:
    """A stored intervention: its action comes back as the text naming it, never as code."""
    change = d.get("max_abs_change")
    return InterventionRecord(d["site"], d["label"], d["action"],
                              float("nan") if change is None else change, d["op_index"],
                              d.get("number", 0), d.get("before"), d.get("part"))


def _known(cls: type, fields: dict[str, Any]) -> dict[str, Any]:
    """The entries naming fields of `cls`: fields added by a later torchlog are ignored."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in fields.items() if k in names}


def _pass_from_dict(d: dict[str, Any], load_ref: Callable[[str, dict], Any]) -> PassRecord:
    fields: dict[str, Any] = {}
    for stored, value in d.items():
        name = _FIELD_NAMES.get(stored, stored)
        if name in TENSOR_FIELDS:
            fields[name] = None if value is None else load_ref(name, value)
        elif name == "tensor_meta":
            shape, dtype, num_bytes = value
            fields[name] = TensorMeta(tuple(shape), dtype_from_name(dtype), num_bytes)
        elif name == "parents":
            fields[name] = tuple(ParentEdge(label, decode(arg)) for label, arg in value)
        elif name == "params":
            fields[name] = tuple(ParamInfo(a, tuple(s), n, b) for a, s, n, b in value)
        elif name == "kind":
            fields[name] = NodeKind(value)
        else:
            fields[name] = decode(value)
    if "kind" not in fields:
        fields["kind"] = _old_kind(fields)
    return PassRecord(**_known(PassRecord, fields))


def _old_kind(fields: dict[str, Any]) -> NodeKind:
    """The kind a record of an older file had, from the flags it stored instead."""
    kinds = [kind for flag, kind in _OLD_KIND_FLAGS.items() if fields.get(flag)]
    return kinds[0] if kinds else NodeKind.OP


def _layer_from_dict(d: dict[str, Any], by_label: dict[str, PassRecord]) -> LayerRecord:
    return LayerRecord(
        label=d["label"],
        layer_type=d["layer_type"],
        passes=tuple(by_label[label] for label in d["passes"]),
        parent_layers={k: PassSpan(tuple(a), tuple(b)) for k, a, b in d["parent_layers"]},
        child_layers={k: PassSpan(tuple(a), tuple(b)) for k, a, b in d["child_layers"]},
    )
