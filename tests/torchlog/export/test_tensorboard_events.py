"""history.to_tensorboard (torchlog/export/tensorboard_*.py), read back with TensorBoard's own
event reader: graph nodes, name scopes, shapes, node statistics, histograms and scalars."""
from __future__ import annotations

import os
import sys

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import torchlog
from tests.torchlog.export.histories import gpt2, nested, partial, recurrent
from tests.invariants import check_history

EVERYTHING = {"histograms": 0, "scalars": 0, "graph": 0}


def _read(folder: str) -> EventAccumulator:
    events = EventAccumulator(folder, size_guidance=EVERYTHING)
    events.Reload()
    return events


def _stats(events: EventAccumulator, step: int = 0) -> dict:
    metadata = events.RunMetadata(f"torchlog step {step}")
    (device,) = metadata.step_stats.dev_stats
    assert device.device == "/device:torchlog:0"
    return {s.node_name: s for s in device.node_stats}


def test_graph_has_a_node_per_pass_under_module_scopes(tmp_path):
    history = nested()
    events = _read(history.to_tensorboard(str(tmp_path)))
    nodes = {node.name: node for node in events.Graph().node}
    assert list(nodes) == [
        "input_1_0", "block1/inner/lin/linear_1_1", "block1/inner/relu_1_2", "block1/add_1_3",
        "block1/norm/layernorm_1_4", "block2/inner/lin/linear_2_5", "block2/inner/relu_2_6",
        "block2/add_2_7", "block2/norm/layernorm_2_8", "head/linear_3_9", "output_1_10"]
    add = nodes["block2/add_2_7"]
    assert add.op == "add"
    assert list(add.input) == ["block2/inner/relu_2_6", "block1/norm/layernorm_1_4"]
    assert [d.size for d in add.attr["_output_shapes"].list.shape[0].dim] == [2, 4]
    lin = nodes["block1/inner/lin/linear_1_1"]
    assert lin.attr["label"].s == b"linear_1_1"
    assert lin.attr["module_calls"].s == b"block1:1 > block1.inner:1 > block1.inner.lin:1"
    assert list(lin.attr["params"].list.s) == [b"block1.inner.lin.weight", b"block1.inner.lin.bias"]
    assert lin.attr["grad_fn"].s == b"AddmmBackward0" and b"models.py" in lin.attr["call_site"].s


def test_node_statistics_hold_time_bytes_and_shape(tmp_path):
    history = nested()
    stats = _stats(_read(history.to_tensorboard(tmp_path)))
    assert len(stats) == len(history)
    lin = stats["block1/inner/lin/linear_1_1"]
    record = history["linear_1_1"]
    assert lin.all_end_rel_nanos == round(record.elapsed_s * 1e9)
    assert lin.all_end_rel_micros == max(1, round(record.elapsed_s * 1e6))
    assert lin.memory[0].total_bytes == 32
    assert [d.size for d in lin.output[0].tensor_description.shape.dim] == [2, 4]
    assert stats["input_1_0"].all_end_rel_micros == 0  # inputs take no time
    starts = [s.all_start_nanos for s in stats.values()]
    assert starts == sorted(starts)  # one op after another, in execution order


def test_histograms_and_scalars_per_saved_activation(tmp_path):
    history = nested()
    events = _read(history.to_tensorboard(tmp_path, step=7))
    tags = events.Tags()
    expected = [p.label for p in history if not p.is_output]
    assert tags["histograms"] == [f"{label}/activations" for label in expected]
    assert tags["scalars"] == [f"{label}/{stat}" for label in expected for stat in ("mean", "std")]
    (histogram,) = events.Histograms("relu_1_2/activations")
    relu = history["relu_1_2"].tensor_contents
    assert histogram.step == 7 and histogram.histogram_value.num == relu.numel()
    assert histogram.histogram_value.min == pytest.approx(relu.min().item())
    assert histogram.histogram_value.max == pytest.approx(relu.max().item())
    (mean,) = events.Scalars("relu_1_2/mean")
    (std,) = events.Scalars("relu_1_2/std")
    assert mean.step == 7 and mean.value == pytest.approx(relu.mean().item())
    assert std.value == pytest.approx(relu.std(unbiased=False).item(), rel=1e-5)
    assert events.Tags()["run_metadata"] == ["torchlog step 7"]


def test_recurrent_passes_sit_in_a_scope_per_layer(tmp_path):
    history = recurrent()
    events = _read(history.to_tensorboard(tmp_path))
    names = [node.name for node in events.Graph().node]
    assert names[:4] == ["input_1_0", "fc/linear_1_1/1", "add_1_2/1", "mul_1_3/1"]
    assert names[-2:] == ["mul_1_3/4", "output_1_4"]
    assert "fc/linear_1_1/3" in names and len(names) == 14
    assert "linear_1_1/pass3/activations" in events.Tags()["histograms"]


def test_partial_history_adds_the_op_that_raised(tmp_path):
    history = partial()
    events = _read(history.to_tensorboard(tmp_path))
    nodes = {node.name: node for node in events.Graph().node}
    assert list(nodes) == ["input_1_0", "first/linear_1_1", "relu_1_2", "raised"]
    assert list(nodes["raised"].input) == ["relu_1_2"]
    assert b"second" in nodes["raised"].attr["failure"].s


def test_nan_and_inf_stay_out_of_histograms(tmp_path):
    x = torch.tensor([[1.0, float("nan"), float("inf"), 3.0]])
    history = torchlog.log_forward_pass(torch.nn.Identity(), x)
    check_history(history)
    events = _read(history.to_tensorboard(tmp_path))
    (histogram,) = events.Histograms("input_1_0/activations")
    assert histogram.histogram_value.num == 2
    assert events.Scalars("input_1_0/mean")[0].value == pytest.approx(2.0)


def test_a_writer_given_is_used_and_left_open(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path))
    history = nested()
    assert history.to_tensorboard(writer, step=1) == str(tmp_path)
    writer.add_scalar("loss", 0.5, 1)  # still open
    writer.close()
    tags = _read(str(tmp_path)).Tags()
    assert tags["graph"] and "loss" in tags["scalars"] and "add_1_3/mean" in tags["scalars"]


def test_a_tensorboardx_writer_works_too(tmp_path):
    tensorboardx = pytest.importorskip("tensorboardX")
    with tensorboardx.SummaryWriter(str(tmp_path)) as writer:
        nested().to_tensorboard(writer)
    events = _read(str(tmp_path))
    assert len(events.Graph().node) == 11 and "head/linear_3_9" in _stats(events)


def test_history_loaded_from_hdf5_writes_the_same_events(tmp_path):
    history = nested()
    loaded = torchlog.load(history.save(str(tmp_path / "run.h5")))
    events = _read(loaded.to_tensorboard(str(tmp_path / "tb")))
    assert [n.name for n in events.Graph().node][4] == "block1/norm/layernorm_1_4"
    assert len(events.Tags()["histograms"]) == 10


def test_extract_writes_per_batch_histograms(tmp_path):
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
    torchlog.extract(net, torch.rand(10, 3), ["relu_1_2"], str(tmp_path / "acts.h5"),
                     batch_size=4, tensorboard=str(tmp_path / "tb"), progress=False)
    events = _read(str(tmp_path / "tb"))
    assert events.Tags()["histograms"] == ["relu_1_2/activations"]
    assert [h.step for h in events.Histograms("relu_1_2/activations")] == [0, 1, 2]
    assert [h.histogram_value.num for h in events.Histograms("relu_1_2/activations")] == [16, 16, 8]


class Twice(torch.nn.Module):
    """One Linear called twice: its label has two passes, tagged `/pass1` and `/pass2`."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.fc(torch.relu(self.fc(x)))


def test_extract_summaries_come_from_the_values_not_from_logging_each_batch(tmp_path, monkeypatch):
    """Only the first batch is logged (the driver's probe); every batch's histogram and mean
    equal the values a forward hook sees, under the tags a logged history gets."""
    import torchlog.datasets.driver as driver

    logged = []
    original = driver.log_forward_pass
    monkeypatch.setattr(driver, "log_forward_pass", lambda *a, **k: logged.append(1) or original(*a, **k))
    torch.manual_seed(0)
    net, data = Twice(), torch.randn(10, 3)
    torchlog.extract(net, data, ["fc"], str(tmp_path / "acts.h5"), batch_size=4,
                     tensorboard=str(tmp_path / "tb"), progress=False)
    assert len(logged) == 1  # of 3 batches
    seen = []
    handle = net.fc.register_forward_hook(lambda m, a, out: seen.append(out.detach()))
    with torch.no_grad():
        for batch in data.split(4):
            net(batch)
    handle.remove()
    events = _read(str(tmp_path / "tb"))
    tags = sorted(events.Tags()["scalars"])
    assert tags == ["linear_1_1/pass1/mean", "linear_1_1/pass1/std", "linear_1_1/pass2/mean", "linear_1_1/pass2/std"]
    for call, tag in ((0, "linear_1_1/pass1"), (1, "linear_1_1/pass2")):
        means = [e.value for e in events.Scalars(f"{tag}/mean")]
        want = [float(seen[2 * b + call].mean()) for b in range(3)]
        assert means == pytest.approx(want, rel=1e-5, abs=1e-6)
        assert [h.histogram_value.num for h in events.Histograms(f"{tag}/activations")] == [12, 12, 6]


def test_a_folder_that_cannot_be_written_is_named(tmp_path, monkeypatch):
    history = nested()
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(torchlog.LogFilePermissionError, match="a_file.*is a file"):
        history.to_tensorboard(str(blocker / "logs"))
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    monkeypatch.setattr(os, "access", lambda *args, **kwargs: False)  # root may write anywhere
    with pytest.raises(torchlog.LogFilePermissionError, match="'.*locked' is not writable"):
        history.to_tensorboard(str(locked / "logs"))


@pytest.mark.parametrize("bad", [42, None, [1]])
def test_neither_a_folder_nor_a_writer_is_named(bad):
    with pytest.raises(torchlog.InvalidArgumentTypeError, match="SummaryWriter"):
        nested().to_tensorboard(bad)


def test_step_must_be_an_int(tmp_path):
    with pytest.raises(torchlog.InvalidArgumentTypeError, match="'3'"):
        nested().to_tensorboard(tmp_path, step="3")


def test_missing_tensorboard_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(torchlog.MissingDependencyError, match=r"torchlog\[tensorboard\]"):
        nested().to_tensorboard(tmp_path)


@pytest.mark.heavy
def test_gpt2_events(tmp_path):
    history, _, _ = gpt2()
    events = _read(history.to_tensorboard(str(tmp_path)))
    names = [node.name for node in events.Graph().node]
    assert len(names) == len(history) == len(_stats(events))
    assert any(n.startswith("transformer/h/1/attn/c_attn/") for n in names)
    assert len(events.Tags()["histograms"]) == sum(
        1 for p in history if not p.is_output and p.tensor_contents.numel())
