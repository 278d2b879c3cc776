"""A ModelHistory as an ONNX model for Netron: logged ops as nodes, module calls as functions."""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from torchlog.errors import (
    InvalidArgumentTypeError, InvalidOptionError, LogFileNotFoundError, LogFilePermissionError,
)
from torchlog.optional import require
from torchlog.export.netron_metrics import metrics_path, write_metrics
from torchlog.export.onnx_functions import (
    MODULE_DOMAIN, OP_DOMAIN, CallScope, call_tree, function_name,
)
from torchlog.records import PassRecord

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["to_onnx", "build_model", "IR_VERSION", "FAILURE_NODE"]

IR_VERSION = 10  # the first with function overloads, node metadata and function value_info
FAILURE_NODE = "raised"  # the op that raised, in a partial history
_SUFFIXES = (".onnx", ".json")
# torch dtype -> name of the onnx.TensorProto data type.
_DTYPES = {
    torch.float32: "FLOAT", torch.float64: "DOUBLE", torch.float16: "FLOAT16",
    torch.bfloat16: "BFLOAT16", torch.int64: "INT64", torch.int32: "INT32", torch.int16: "INT16",
    torch.int8: "INT8", torch.uint8: "UINT8", torch.bool: "BOOL", torch.complex64: "COMPLEX64",
    torch.complex128: "COMPLEX128", torch.float8_e4m3fn: "FLOAT8E4M3FN",
    torch.float8_e5m2: "FLOAT8E5M2",
}


def _onnx() -> Any:
    return require("onnx", "history.to_onnx()")


def to_onnx(history: "ModelHistory", path: str | os.PathLike) -> str:
    """Write the logged graph as an ONNX file Netron opens, plus a metrics file beside it.

    Every logged op is one node named by its label, with its torch function as operator
    type in the `torchlog` domain; model inputs are graph inputs and every tensor has its
    shape and dtype. Each module call is a function (domain `torchlog.module`, type the
    module's class, overload the call such as `block1:1`) whose body holds the call's ops,
    so Netron draws it as one node that opens like a subgraph. Node metadata holds the
    module calls, call site, parameters and grad_fn. `run.onnx` (or `run.onnx.json`, ONNX's
    JSON form) gets `run.metrics.json` beside it: per-node time, bytes and, for saved
    activations, statistics, which Netron shows in its sidebar once that file is opened
    too. The binary form passes `onnx.checker`.

    Returns:
        The path written.

    Raises:
        MissingDependencyError: onnx is not installed (`pip install torchlog[onnx]`).
        InvalidOptionError: `path` does not end with '.onnx' or '.json'.
        LogFileNotFoundError: the folder of `path` does not exist.
        LogFilePermissionError: the folder cannot be written.

    Example:
        >>> import tempfile, onnx, torch, torchlog
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 2))
        >>> h = torchlog.log_forward_pass(net, torch.ones(1, 3))
        >>> model = onnx.load(to_onnx(h, f"{tempfile.mkdtemp()}/net.onnx"))
        >>> onnx.checker.check_model(model, full_check=True)
        >>> [(node.name, node.op_type) for node in model.graph.node]
        [('0:1', 'Linear'), ('output_1_2', 'output')]
        >>> [node.name for node in model.functions[0].node]
        ['linear_1_1']
    """
    target = _check_path(path)
    onnx = _onnx()
    model = build_model(history)
    if target.suffix == ".json":
        from google.protobuf import json_format

        target.write_text(json_format.MessageToJson(model), encoding="utf-8")
    else:
        onnx.save_model(model, str(target))
    write_metrics(history, metrics_path(target))
    return str(target)


def _check_path(path: Any) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentTypeError(f"path must be a str or path-like, got {path!r}")
    target = Path(path).expanduser()
    if target.suffix not in _SUFFIXES:
        raise InvalidOptionError(
            f"path {str(path)!r} must end with '.onnx' (binary) or '.json' (ONNX's JSON form, "
            "e.g. 'run.onnx.json')")
    folder = target.parent
    if not folder.is_dir():
        raise LogFileNotFoundError(
            f"cannot write {str(path)!r}: folder {str(folder)!r} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise LogFilePermissionError(f"cannot write {str(path)!r}: it or its folder is not writable")
    return target


def build_model(history: "ModelHistory") -> Any:
    """The ONNX ModelProto of `history` (see `to_onnx`), without writing anything.

    Raises:
        MissingDependencyError: onnx is not installed.

    Example:
        >>> import torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.ReLU(), torch.ones(2))
        >>> model = build_model(h)
        >>> [(n.name, n.domain) for n in model.graph.node], model.graph.input[0].name
        ([('relu_1_1', 'torchlog'), ('output_1_2', 'torchlog')], 'input_1_0')
    """
    onnx = _onnx()
    helper = onnx.helper
    by_label = {record.label: record for record in history}
    root = call_tree(history)
    functions: list[Any] = []
    nodes = _body(root, by_label, dict(history.modules), functions)
    if history.is_partial:
        failed = [label for label in history.info.failed_parents if label in by_label]
        nodes.append(helper.make_node(FAILURE_NODE, failed, [], name=FAILURE_NODE, domain=OP_DOMAIN,
                                      doc_string=history.info.failure or ""))
    inputs = [_value_info(r) for r in history if r.is_input]
    outputs = [_value_info(r) for r in history if r.is_output]
    shown = {r.label for r in history if r.is_input or r.is_output}
    graph = helper.make_graph(nodes, history.model_name, inputs, outputs,
                              value_info=[_value_info(r) for r in history if r.label not in shown])
    opsets = [helper.make_opsetid(OP_DOMAIN, 1), helper.make_opsetid(MODULE_DOMAIN, 1)]
    model = helper.make_model(graph, opset_imports=opsets, functions=functions,
                              producer_name="torchlog", ir_version=IR_VERSION)
    if history.is_partial:
        helper.set_model_props(model, {"failure": history.info.failure or ""})
    return model


def _body(scope: CallScope, by_label: dict[str, PassRecord], modules: dict, functions: list) -> list:
    """The nodes directly inside `scope`; nested calls become calls of new functions."""
    helper = _onnx().helper
    nodes = []
    for item in scope.items:
        if isinstance(item, PassRecord):
            nodes.append(_op_node(item, by_label))
            continue
        name, overload = function_name(item, modules)
        call = helper.make_node(name, item.inputs, item.outputs, name=item.key, domain=MODULE_DOMAIN)
        call.overload = overload
        nodes.append(call)
        functions.append(_function(item, name, overload, by_label, modules, functions))
    return nodes


def _function(scope: CallScope, name: str, overload: str, by_label: dict[str, PassRecord],
              modules: dict, functions: list) -> Any:
    helper = _onnx().helper
    body = _body(scope, by_label, modules, functions)
    opsets = [helper.make_opsetid(OP_DOMAIN, 1), helper.make_opsetid(MODULE_DOMAIN, 1)]
    function = helper.make_function(MODULE_DOMAIN, name, scope.inputs, scope.outputs, body, opsets,
                                    doc_string=f"call {scope.key}")
    function.overload = overload
    values = dict.fromkeys(scope.inputs + [out for node in body for out in node.output])
    function.value_info.extend(_value_info(by_label[label]) for label in values)
    return function


def _op_node(record: PassRecord, by_label: dict[str, PassRecord]) -> Any:
    helper = _onnx().helper
    inputs = [edge.label for edge in record.parents if edge.label in by_label]
    node = helper.make_node(record.func_name, inputs, [record.label], name=record.label,
                            domain=OP_DOMAIN)
    props = {"layer": record.layer_label,
             "module_calls": " > ".join(reversed(record.containing_modules)),
             "call_site": record.call_site or "", "grad_fn": record.grad_fn_name or "",
             "params": ", ".join(f"{p.address} {tuple(p.shape)}" for p in record.params),
             "pass": f"{record.pass_num} of {record.num_passes}" if record.num_passes > 1 else ""}
    for key, value in props.items():
        if value:
            node.metadata_props.add(key=key, value=value)
    return node


def _value_info(record: PassRecord) -> Any:
    onnx = _onnx()
    elem_type = getattr(onnx.TensorProto, _DTYPES.get(record.dtype, "UNDEFINED"))
    return onnx.helper.make_tensor_value_info(record.label, elem_type, list(record.shape))
