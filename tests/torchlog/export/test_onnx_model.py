"""history.to_onnx (torchlog/export/onnx_*.py, netron_metrics.py): the ONNX graph, its module
functions, shapes and dtypes, node metadata, the metrics attachment, and bad paths."""
from __future__ import annotations

import json
import os
import sys

import onnx
import pytest
import torch
from google.protobuf import json_format

import torchlog
from tests.torchlog.export.histories import gpt2, logged, nested, partial, recurrent
from torchlog.export.netron_metrics import SIGNATURE, metrics_path


def _write(history, tmp_path, name: str = "run.onnx") -> onnx.ModelProto:
    path = history.to_onnx(str(tmp_path / name))
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    return model


def _all_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return list(model.graph.node) + [n for f in model.functions for n in f.node]


def _op_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in _all_nodes(model) if n.domain == "torchlog"]


def test_top_level_graph_holds_the_module_calls(tmp_path):
    model = _write(nested(), tmp_path)
    assert [(n.name, n.op_type, n.domain) for n in model.graph.node] == [
        ("block1:1", "Middle", "torchlog.module"), ("block2:1", "Middle", "torchlog.module"),
        ("head:1", "Linear", "torchlog.module"), ("output_1_10", "output", "torchlog")]
    assert [i.name for i in model.graph.input] == ["input_1_0"]
    assert [o.name for o in model.graph.output] == ["output_1_10"]
    assert model.producer_name == "torchlog" and model.ir_version == 10


def test_every_op_is_one_node_named_by_its_label(tmp_path):
    history = nested()
    model = _write(history, tmp_path)
    ops = _op_nodes(model)
    assert sorted(n.name for n in ops) == sorted(p.label for p in history if not p.is_input)
    by_name = {n.name: n for n in ops}
    assert by_name["add_2_7"].op_type == "add"
    assert list(by_name["add_2_7"].input) == ["relu_2_6", "layernorm_1_4"]
    assert list(by_name["add_2_7"].output) == ["add_2_7"]
    props = {p.key: p.value for p in by_name["linear_1_1"].metadata_props}
    assert props["module_calls"] == "block1:1 > block1.inner:1 > block1.inner.lin:1"
    assert props["params"] == "block1.inner.lin.weight (4, 4), block1.inner.lin.bias (4,)"
    assert props["grad_fn"] == "AddmmBackward0" and "models.py" in props["call_site"]


def test_module_calls_are_nested_functions(tmp_path):
    model = _write(nested(), tmp_path)
    functions = {f.overload: f for f in model.functions}
    assert sorted(functions) == sorted(
        ["block1:1", "block1.inner:1", "block1.inner.lin:1", "block1.norm:1", "block2:1",
         "block2.inner:1", "block2.inner.lin:1", "block2.norm:1", "head:1"])
    block1 = functions["block1:1"]
    assert (block1.name, block1.domain) == ("Middle", "torchlog.module")
    assert [n.name for n in block1.node] == ["block1.inner:1", "add_1_3", "block1.norm:1"]
    assert list(block1.input) == ["input_1_0"] and list(block1.output) == ["layernorm_1_4"]
    inner = functions["block1.inner:1"]
    assert [(n.name, n.op_type, n.overload) for n in inner.node] == [
        ("block1.inner.lin:1", "Linear", "block1.inner.lin:1"), ("relu_1_2", "relu", "")]


def test_every_tensor_has_its_shape_and_dtype(tmp_path):
    history = nested()
    model = _write(history, tmp_path)
    infos = list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info)
    infos += [v for f in model.functions for v in f.value_info]
    typed = {v.name: v.type.tensor_type for v in infos}
    for record in history:
        tensor_type = typed[record.label]
        assert [d.dim_value for d in tensor_type.shape.dim] == list(record.shape)
        assert tensor_type.elem_type == onnx.TensorProto.FLOAT


def test_dtypes_map_to_onnx_types(tmp_path):
    class Casts(torch.nn.Module):
        def forward(self, x):
            return x.half(), x.long(), x > 0, x.to(torch.bfloat16)

    model = _write(logged(Casts(), torch.ones(3)), tmp_path)
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.output}
    assert list(types.values()) == [onnx.TensorProto.FLOAT16, onnx.TensorProto.INT64,
                                    onnx.TensorProto.BOOL, onnx.TensorProto.BFLOAT16]


def test_metrics_attachment_holds_time_bytes_and_statistics(tmp_path):
    history = nested()
    path = history.to_onnx(str(tmp_path / "run.onnx"))
    assert metrics_path(path) == tmp_path / "run.metrics.json"
    document = json.loads(metrics_path(path).read_text())
    assert document["signature"] == SIGNATURE
    metrics: dict[str, dict] = {}
    for entry in document["metrics"]:
        assert entry["kind"] == "node"
        metrics.setdefault(entry["target"], {})[entry["name"]] = entry["value"]
    relu = history["relu_1_2"]
    values = relu.tensor_contents.double()
    assert metrics["relu_1_2"]["time (µs)"] == pytest.approx(relu.elapsed_s * 1e6, abs=1e-3)
    assert metrics["relu_1_2"]["output bytes"] == 32
    assert metrics["relu_1_2"]["mean"] == pytest.approx(values.mean().item())
    assert metrics["relu_1_2"]["max"] == pytest.approx(values.max().item())
    assert metrics["relu_1_2"]["num_nan"] == 0
    inside = [p for p in history if "block1:1" in p.containing_modules]
    assert metrics["block1:1"]["ops"] == len(inside) == 4
    assert metrics["block1:1"]["time (µs)"] == pytest.approx(
        sum(p.elapsed_s for p in inside) * 1e6, abs=1e-2)
    assert "time (µs)" not in metrics["input_1_0"] and "mean" not in metrics["output_1_10"]


def test_json_form_holds_the_same_model(tmp_path):
    history = nested()
    binary = _write(history, tmp_path)
    path = history.to_onnx(str(tmp_path / "run.onnx.json"))
    parsed = json_format.Parse(open(path).read(), onnx.ModelProto())
    assert parsed == binary
    assert metrics_path(path).exists()


def test_recurrent_calls_are_one_function_each(tmp_path):
    model = _write(recurrent(), tmp_path)
    assert [n.name for n in model.graph.node] == [
        "fc:1", "add_1_2:1", "mul_1_3:1", "fc:2", "add_1_2:2", "mul_1_3:2", "fc:3", "add_1_2:3",
        "mul_1_3:3", "fc:4", "add_1_2:4", "mul_1_3:4", "output_1_4"]
    assert [(f.overload, list(f.input), list(f.output)) for f in model.functions][1] == (
        "fc:2", ["mul_1_3:1"], ["linear_1_1:2"])
    props = {p.key: p.value for p in _op_nodes(model)[0].metadata_props}
    assert props["pass"] == "1 of 4"


def test_partial_history_ends_in_the_op_that_raised(tmp_path):
    model = _write(partial(), tmp_path)
    assert [(n.name, list(n.input)) for n in model.graph.node] == [
        ("first:1", ["input_1_0"]), ("relu_1_2", ["linear_1_1"]), ("raised", ["relu_1_2"])]
    assert len(model.graph.output) == 0
    assert "second" in {p.key: p.value for p in model.metadata_props}["failure"]


def test_history_loaded_from_hdf5_writes_the_same_model(tmp_path):
    history = nested()
    loaded = torchlog.load(history.save(str(tmp_path / "run.h5")))
    assert _write(loaded, tmp_path, "loaded.onnx") == _write(history, tmp_path)
    ours = json.loads(metrics_path(tmp_path / "run.onnx").read_text())["metrics"]
    theirs = json.loads(metrics_path(tmp_path / "loaded.onnx").read_text())["metrics"]
    assert ours == theirs


@pytest.mark.parametrize("name", ["run.txt", "run", "run.onnx.bak"])
def test_a_path_without_onnx_or_json_suffix_is_named(tmp_path, name):
    with pytest.raises(torchlog.InvalidOptionError, match=name.replace(".", r"\.")):
        nested().to_onnx(str(tmp_path / name))


def test_a_missing_or_unwritable_folder_is_named(tmp_path, monkeypatch):
    history = nested()
    with pytest.raises(torchlog.LogFileNotFoundError, match="no_such_folder"):
        history.to_onnx(str(tmp_path / "no_such_folder" / "run.onnx"))
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    monkeypatch.setattr(os, "access", lambda *args, **kwargs: False)  # root may write anywhere
    with pytest.raises(torchlog.LogFilePermissionError, match="locked.*not writable"):
        history.to_onnx(str(locked / "run.onnx"))


def test_a_path_of_the_wrong_type_is_named():
    with pytest.raises(torchlog.InvalidArgumentTypeError, match="42"):
        nested().to_onnx(42)


def test_missing_onnx_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(torchlog.MissingDependencyError, match=r"torchlog\[onnx\]"):
        nested().to_onnx(str(tmp_path / "run.onnx"))


@pytest.mark.heavy
def test_gpt2_model(tmp_path):
    history, model, _ = gpt2()
    exported = _write(history, tmp_path)
    assert len(_op_nodes(exported)) == sum(1 for p in history if not p.is_input)
    calls = sum(m.num_passes for m in history.modules.values())
    assert len(exported.functions) == calls - sum(
        1 for m in history.modules.values() for inside in m.call_layers if not inside)
    assert [n.op_type for n in exported.graph.node][0] == "GPT2Model"
