"""The TensorBoard graph of a history: a GraphDef of the logged ops and their per-op statistics.

Node names are module paths used as name scopes (`block1/inner/lin/linear_1_1`), so the
Graphs tab folds each module into a box; the passes of a layer that ran several times
sit in a scope named by the layer (`cell/linear_1_1/2`), which the tab stacks into a
series. Output shapes go in `_output_shapes`, which the tab writes on edges. Each op's
time and output bytes go in a RunMetadata, which lets the tab colour nodes by compute
time and memory.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import torch

from torchlog.optional import require
from torchlog.records import PassRecord

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["node_name", "graph_def", "run_metadata", "STATS_DEVICE", "FAILURE_NODE"]

STATS_DEVICE = "/device:torchlog:0"  # TensorBoard counts stats of devices named 'device:X:N'
ALLOCATOR = "torchlog"
SAVED_ALLOCATOR = "torchlog saved for backward"
FAILURE_NODE = "raised"  # the op that raised, in a partial history
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")
# torch dtype -> name of TensorFlow's DataType enum value (as TensorBoard shows it).
_DTYPES = {
    torch.float32: "DT_FLOAT", torch.float64: "DT_DOUBLE", torch.float16: "DT_HALF",
    torch.bfloat16: "DT_BFLOAT16", torch.int64: "DT_INT64", torch.int32: "DT_INT32",
    torch.int16: "DT_INT16", torch.int8: "DT_INT8", torch.uint8: "DT_UINT8", torch.bool: "DT_BOOL",
    torch.complex64: "DT_COMPLEX64", torch.complex128: "DT_COMPLEX128",
}


def _protos() -> Any:
    return require("tensorboard.compat.proto.graph_pb2", "history.to_tensorboard()")


def node_name(record: PassRecord) -> str:
    """The scoped TensorBoard name of a pass: innermost module address with '/' for '.'.

    Example:
        >>> import torch, torchlog
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> h = torchlog.log_forward_pass(net, torch.ones(1, 2))
        >>> node_name(h['linear_1_1']), node_name(h['input_1_0'])
        ('0/linear_1_1', 'input_1_0')
    """
    leaf = record.label if record.num_passes == 1 else f"{record.layer_label}/{record.pass_num}"
    if record.module is None:
        return leaf
    scope = "/".join(_UNSAFE.sub("_", part) for part in record.module.split("."))
    return f"{scope}/{leaf}"


def graph_def(history: "ModelHistory") -> Any:
    """A GraphDef with one node per pass, inputs in argument order, and attributes.

    Attributes: `_output_shapes`, `dtype`, and as strings `label`, `module_calls`,
    `call_site`, `grad_fn` and `params`. A partial history gets one more node,
    'raised', fed by the tensors the failing op received.

    Raises:
        MissingDependencyError: the tensorboard package is missing.

    Example:
        >>> import torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.ReLU(), torch.ones(2))
        >>> graph = graph_def(h)
        >>> [node.name for node in graph.node], list(graph.node[1].input)
        (['input_1_0', 'relu_1_1', 'output_1_2'], ['input_1_0'])
    """
    graph_pb2 = _protos()
    from tensorboard.compat.proto import versions_pb2

    names = {record.label: node_name(record) for record in history}
    graph = graph_pb2.GraphDef(versions=versions_pb2.VersionDef(producer=22))
    for record in history:
        inputs = [names[edge.label] for edge in record.parents if edge.label in names]
        graph.node.append(_node(record, names[record.label], inputs))
    if history.is_partial:
        from tensorboard.compat.proto import node_def_pb2

        failed = node_def_pb2.NodeDef(name=FAILURE_NODE, op="raised")
        failed.input.extend(names[label] for label in history.info.failed_parents if label in names)
        failed.attr["failure"].s = (history.info.failure or "").encode()
        graph.node.append(failed)
    return graph


def _node(record: PassRecord, name: str, inputs: list[str]) -> Any:
    from tensorboard.compat.proto import node_def_pb2, types_pb2

    node = node_def_pb2.NodeDef(name=name, op=record.func_name, input=inputs)
    node.attr["_output_shapes"].list.shape.append(_shape(record.shape))
    node.attr["dtype"].type = types_pb2.DataType.Value(_DTYPES.get(record.dtype, "DT_INVALID"))
    texts = {"label": record.label, "module_calls": " > ".join(reversed(record.containing_modules)),
             "call_site": record.call_site or "", "grad_fn": record.grad_fn_name or ""}
    for key, text in texts.items():
        if text:
            node.attr[key].s = text.encode()
    if record.params:
        node.attr["params"].list.s.extend(p.address.encode() for p in record.params)
    return node


def _shape(shape: tuple[int, ...]) -> Any:
    from tensorboard.compat.proto import tensor_shape_pb2

    proto = tensor_shape_pb2.TensorShapeProto()
    for size in shape:
        proto.dim.add(size=size)
    return proto


def run_metadata(history: "ModelHistory") -> Any:
    """Per-op statistics: time (µs, at least 1 for an op that took any time), output bytes
    and shape; with profile=True also the bytes saved for backward (a second allocator,
    so the tab's memory colour counts them) and the CUDA peak. Ops ran one after another,
    so each starts where the previous one ended.

    Raises:
        MissingDependencyError: the tensorboard package is missing.

    Example:
        >>> import torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.ReLU(), torch.ones(2))
        >>> stats = run_metadata(h).step_stats.dev_stats[0].node_stats
        >>> stats[1].node_name, stats[1].memory[0].total_bytes
        ('relu_1_1', 8)
    """
    _protos()
    from tensorboard.compat.proto import config_pb2, step_stats_pb2

    device = step_stats_pb2.DeviceStepStats(device=STATS_DEVICE)
    start_ns = 0
    for record in history:
        elapsed_ns = round(record.elapsed_s * 1e9)
        stats = device.node_stats.add(node_name=node_name(record), all_start_nanos=start_ns,
                                      all_start_micros=start_ns // 1000,
                                      all_end_rel_nanos=elapsed_ns, op_end_rel_nanos=elapsed_ns)
        if elapsed_ns > 0:  # TensorBoard ignores a zero time, as it should for inputs
            stats.all_end_rel_micros = stats.op_end_rel_micros = max(1, round(elapsed_ns / 1000))
        stats.memory.add(allocator_name=ALLOCATOR, total_bytes=record.num_bytes,
                         peak_bytes=record.peak_bytes or 0)
        if record.saved_for_backward_bytes:  # profile=True: counted in the tab's memory too
            stats.memory.add(allocator_name=SAVED_ALLOCATOR,
                             total_bytes=record.saved_for_backward_bytes)
        output = stats.output.add(slot=0)
        output.tensor_description.shape.CopyFrom(_shape(record.shape))
        output.tensor_description.allocation_description.requested_bytes = record.num_bytes
        output.tensor_description.allocation_description.allocator_name = ALLOCATOR
        start_ns += elapsed_ns
    metadata = config_pb2.RunMetadata()
    metadata.step_stats.dev_stats.append(device)
    return metadata
