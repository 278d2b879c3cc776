"""history.cost_by_module (torchlog/export/costs.py) and the profile=True figures in every exporter."""
from __future__ import annotations

import json

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.torchlog.export.histories import nested, recurrent
from torchlog.export.netron_metrics import metrics_path


def test_sums_per_module_call_with_nested_modules_included():
    history = nested(profile=True)
    costs = history.cost_by_module()
    assert list(costs) == ["block1:1", "block1.inner:1", "block1.inner.lin:1", "block1.norm:1",
                           "block2:1", "block2.inner:1", "block2.inner.lin:1", "block2.norm:1",
                           "head:1"]
    inside = [p for p in history if "block1:1" in p.containing_modules]
    block1 = costs["block1:1"]
    assert block1.num_ops == 4 and block1.output_bytes == 128
    assert block1.elapsed_s == pytest.approx(sum(p.elapsed_s for p in inside))
    assert block1.saved_for_backward_bytes == sum(p.saved_for_backward_bytes for p in inside) > 0
    assert block1.peak_bytes is None  # CPU


def test_each_call_of_a_module_in_a_loop_is_its_own_entry():
    history = recurrent(profile=True)
    costs = history.cost_by_module()
    assert list(costs) == ["fc:1", "fc:2", "fc:3", "fc:4"]
    assert costs["fc:3"].saved_for_backward_bytes == history["linear_1_1:3"].saved_for_backward_bytes


def test_without_profile_only_time_and_output_bytes():
    cost = nested().cost_by_module()["head:1"]
    assert cost.output_bytes == 16 and cost.elapsed_s > 0
    assert cost.saved_for_backward_bytes is None and cost.peak_bytes is None


def test_exporters_carry_the_profile_figures(tmp_path):
    history = nested(profile=True)
    layernorm = history["layernorm_1_4"]
    assert layernorm.saved_for_backward_bytes == 48  # its input and the mean and rstd per row
    node = history.to_networkx().nodes["layernorm_1_4"]
    assert node["saved_for_backward_bytes"] == 48 and node["peak_bytes"] is None
    rolled = recurrent(profile=True).to_networkx(mode="rolled").nodes["linear_1_1"]
    assert rolled["saved_for_backward_bytes"] == 4 * 20

    events = EventAccumulator(history.to_tensorboard(str(tmp_path / "tb")))
    events.Reload()
    (device,) = events.RunMetadata("torchlog step 0").step_stats.dev_stats
    stats = {s.node_name: s for s in device.node_stats}
    memory = stats["block1/norm/layernorm_1_4"].memory
    assert [(m.allocator_name, m.total_bytes) for m in memory] == [
        ("torchlog", 32), ("torchlog saved for backward", 48)]

    path = history.to_onnx(str(tmp_path / "run.onnx"))
    metrics = json.loads(metrics_path(path).read_text())["metrics"]
    found = {(m["target"], m["name"]): m["value"] for m in metrics}
    assert found[("layernorm_1_4", "saved for backward bytes")] == 48
    assert found[("block1:1", "saved for backward bytes")] == \
        history.cost_by_module()["block1:1"].saved_for_backward_bytes
    assert ("layernorm_1_4", "CUDA peak bytes") not in found
