"""The ModelHistory contract: a sequence of passes with keyed lookup, every public member used
on a real history, and no member inherited from an ABC that does not work."""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import torch

import torchlog
from tests.models import SimpleRecurrent, WithBuffers
from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError, LayerNotFoundError
from torchlog.history import ModelHistory, RunInfo, all_passes
from torchlog.records import LayerRecord, ModuleRecord, NodeKind, PassRecord

LABELS = ["input_1_0", "linear_1_1:1", "add_1_2:1", "mul_1_3:1", "linear_1_1:2", "add_1_2:2",
          "mul_1_3:2", "linear_1_1:3", "add_1_2:3", "mul_1_3:3", "linear_1_1:4", "add_1_2:4",
          "mul_1_3:4", "output_1_4"]


@pytest.fixture(scope="module")
def history() -> ModelHistory:
    torch.manual_seed(0)
    x = torch.rand(2, 5, requires_grad=True)
    return torchlog.log_forward_pass(SimpleRecurrent(), x, random_seed=7, save_gradients=True)


def _public(obj: object) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


# Each public member and the test below that uses it; a new member needs a test here.
COVERED = {
    "keys": "test_keys_values_items_are_one_dict_of_label_to_pass",
    "values": "test_keys_values_items_are_one_dict_of_label_to_pass",
    "items": "test_keys_values_items_are_one_dict_of_label_to_pass",
    "get": "test_get_returns_the_default_only_for_keys_that_find_nothing",
    "index": "test_inherited_sequence_methods_work",
    "count": "test_inherited_sequence_methods_work",
    "position": "test_position_and_lookup_keys_answer_for_each_pass",
    "lookup_keys": "test_position_and_lookup_keys_answer_for_each_pass",
    "layer_labels": "test_views_are_copies_in_execution_order",
    "passes": "test_views_are_copies_in_execution_order",
    "layers": "test_views_are_copies_in_execution_order",
    "layer": "test_layer_gives_the_rolled_record",
    "modules": "test_modules_is_read_only",
    "info": "test_run_facts",
    "model_name": "test_run_facts",
    "random_seed": "test_run_facts",
    "elapsed_s": "test_run_facts",
    "is_partial": "test_run_facts",
    "input_layers": "test_kinds_and_counts",
    "output_layers": "test_kinds_and_counts",
    "num_tensors": "test_kinds_and_counts",
    "num_bytes": "test_kinds_and_counts",
    "num_saved": "test_kinds_and_counts",
    "num_saved_bytes": "test_kinds_and_counts",
    "num_stored_bytes": "test_kinds_and_counts",
    "param_passes": "test_kinds_and_counts",
    "num_params": "test_kinds_and_counts",
    "max_passes": "test_structure_facts",
    "is_recurrent": "test_structure_facts",
    "has_branching": "test_structure_facts",
    "layers_with_grads": "test_log_backward_fills_gradients",
    "log_backward": "test_log_backward_fills_gradients",
    "to_pandas": "test_to_pandas",
    "to_dot": "test_to_dot_and_render_graph",
    "render_graph": "test_to_dot_and_render_graph",
    "save": "test_save_round_trip",
    "to_html": "test_to_html_and_show",
    "show": "test_to_html_and_show",
    "module_tree": "test_exports",
    "cost_by_module": "test_exports",
    "to_networkx": "test_exports",
    "to_onnx": "test_exports",
    "to_tensorboard": "test_exports",
    "summary": "test_summary_str_and_repr",
    "interventions": "test_interventions_and_stop",
    "stopped_at": "test_interventions_and_stop",
}


def test_interventions_and_stop(history: ModelHistory) -> None:
    assert history.interventions == () and history.stopped_at is None
    from torchlog.interventions import scale

    acted = torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5), stop_after="add_1_2:2",
                                      intervene={"linear_1_1:2": scale(2.0)})
    assert [r.label for r in acted.interventions] == ["linear_1_1:2"] and acted.stopped_at == "add_1_2:2"


def test_every_public_member_is_covered(history: ModelHistory) -> None:
    assert _public(history) == set(COVERED), (
        f"untested: {sorted(_public(history) - set(COVERED))}, "
        f"gone: {sorted(set(COVERED) - _public(history))}")
    tests = {name for name in globals() if name.startswith("test_")}
    assert set(COVERED.values()) <= tests


def test_it_is_a_sequence_not_a_mapping(history: ModelHistory) -> None:
    assert isinstance(history, Sequence) and not isinstance(history, Mapping)
    assert len(history) == len(LABELS)
    assert [p.label for p in history] == LABELS
    assert [p.label for p in reversed(history)] == LABELS[::-1]
    assert history[0].label == "input_1_0" and history[-1].label == "output_1_4"
    assert [p.label for p in history[1:4]] == LABELS[1:4]
    assert history[::-1] == list(reversed(history))


def test_inherited_sequence_methods_work(history: ModelHistory) -> None:
    record = history["add_1_2:3"]
    assert history.index(record) == LABELS.index("add_1_2:3")
    assert history.index(record, 2, 10) == LABELS.index("add_1_2:3")
    assert history.count(record) == 1 and history.count("add_1_2:3") == 0
    with pytest.raises(ValueError):
        history.index(record, 0, 3)


def test_str_keys_find_passes_and_layers(history: ModelHistory) -> None:
    assert history["linear_1_1:2"] is history[4]
    assert history["linear_1_1"] is history.layer("linear_1_1")
    assert history["linear_1"] is history["linear_1_1"]
    assert history["fc:3"] is history["linear_1_1:3"]
    assert history["fc"] is history.layer("linear_1_1")  # every call returned a pass of one layer
    assert history["output_1_4"] is history[-1]


@pytest.mark.parametrize("key, error, shown", [
    ("linear_9_9", LayerNotFoundError, "'linear_9_9'"),
    ("linear_1_1:5", LayerNotFoundError, "passes 1..4"),
    (len(LABELS), LayerNotFoundError, f"-{len(LABELS)}..{len(LABELS) - 1}"),
    (1.5, InvalidArgumentTypeError, "1.5"),
    (True, InvalidArgumentTypeError, "True"),
])
def test_bad_keys_raise(history: ModelHistory, key: object, error: type, shown: str) -> None:
    with pytest.raises(error, match=re.escape(shown)):
        history[key]


def test_contains_holds_for_every_accepted_key_and_own_pass(history: ModelHistory) -> None:
    for key in ("linear_1_1", "linear_1", "linear_1_1:4", "fc", "fc:2", 0, -len(LABELS)):
        assert key in history, key
    for key in ("linear_1_1:5", "nope", len(LABELS), 1.5, True, None):
        assert key not in history, key
    assert history[3] in history
    other = torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5))
    assert other[3] not in history


def test_get_returns_the_default_only_for_keys_that_find_nothing(history: ModelHistory) -> None:
    assert history.get("mul_1_3:2") is history["mul_1_3:2"]
    assert history.get(-1) is history[-1]
    assert history.get("nope") is None and history.get(99, "absent") == "absent"
    with pytest.raises(InvalidArgumentTypeError):
        history.get(1.5)


def test_keys_values_items_are_one_dict_of_label_to_pass(history: ModelHistory) -> None:
    assert history.keys() == LABELS
    assert history.values() == list(history)
    assert history.items() == list(zip(LABELS, history))
    assert dict(history.items()) == {label: history[label] for label in LABELS}


def test_position_and_lookup_keys_answer_for_each_pass(history: ModelHistory) -> None:
    for pos, label in enumerate(LABELS):
        assert history.position(label) == pos
        keys = history.lookup_keys(label)
        assert keys[:2] == (pos - len(LABELS), pos)
        assert all(history[key] is history[pos] for key in keys)
    assert history.lookup_keys("linear_1_1:2") == (-10, 4, "linear_1_1:2", "fc:2")
    assert history.lookup_keys("output_1_4") == (-1, 13, "output_1_4", "output_1_4:1")
    for bad in ("linear_1_1", "fc:2", "nope"):  # a layer and a module call are not pass labels
        with pytest.raises(LayerNotFoundError, match="layer_labels"):
            history.position(bad)
        with pytest.raises(LayerNotFoundError, match="layer_labels"):
            history.lookup_keys(bad)


def test_records_hold_no_history_state(history: ModelHistory) -> None:
    fields = {name for name in PassRecord.__dataclass_fields__}
    assert not fields & {"num_ops", "lookup_keys", "is_input", "is_output", "is_buffer",
                         "is_source", "is_created"}
    pruned = torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5), layers_to_save=["mul_1_3:4"])
    (record,) = pruned  # exactly the chosen pass; output_layers names only passes it holds
    assert pruned.output_layers == []
    assert pruned.lookup_keys(record.label)[:3] == (-1, 0, "mul_1_3:4")
    assert str(record).startswith("Layer mul_1_3:4 (pass 4 of 4), operation 1/1:")
    assert record.op_index == 12 and len(all_passes(pruned)) == len(LABELS)


def test_printing_a_pass_shows_its_place_in_its_history(history: ModelHistory) -> None:
    text = str(history["linear_1_1:2"]).splitlines()
    assert text[0] == "Layer linear_1_1:2 (pass 2 of 4), operation 5/14:"
    assert text[-1] == "    Lookup keys: -10, 4, linear_1_1:2, fc:2"
    made = torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5))["mul_1_3:4"]
    # The history was a temporary: the pass still prints its place in it.
    assert str(made).splitlines()[0] == "Layer mul_1_3:4 (pass 4 of 4), operation 13/14:"


def test_views_are_copies_in_execution_order(history: ModelHistory) -> None:
    assert history.layer_labels == LABELS
    assert history.passes == list(history)
    history.passes.clear()
    history.layer_labels.clear()
    assert len(history.passes) == len(LABELS)
    assert [l.label for l in history.layers] == ["input_1_0", "linear_1_1", "add_1_2", "mul_1_3",
                                                 "output_1_4"]
    history.layers.clear()
    assert len(history.layers) == 5


def test_layer_gives_the_rolled_record(history: ModelHistory) -> None:
    layer = history.layer("linear_1_1:2")
    assert isinstance(layer, LayerRecord) and layer.label == "linear_1_1" and len(layer) == 4
    assert history.layer("input_1_0").passes == (history[0],)
    with pytest.raises(LayerNotFoundError, match="closest labels"):
        history.layer("linear_9")


def test_modules_is_read_only(history: ModelHistory) -> None:
    assert list(history.modules) == ["fc"]
    assert isinstance(history.modules["fc"], ModuleRecord) and history.modules["fc"].num_passes == 4
    with pytest.raises(TypeError):
        history.modules["fc"] = None  # type: ignore[index]


def test_run_facts(history: ModelHistory) -> None:
    info = history.info
    assert isinstance(info, RunInfo) and info.model_name == history.model_name == "SimpleRecurrent"
    assert history.random_seed == info.random_seed == 7
    assert history.elapsed_s == info.elapsed_s > 0
    assert history.is_partial is info.is_partial is False and info.failure is None
    assert info.num_gradient_hooks == len(LABELS)
    assert info.all_passes == history.passes and all_passes(history) == history.passes
    assert "all_passes" not in repr(info)


def test_kinds_and_counts(history: ModelHistory) -> None:
    assert history.input_layers == ["input_1_0"] and history.output_layers == ["output_1_4"]
    assert [p.kind for p in history][:2] == [NodeKind.INPUT, NodeKind.OP]
    assert history.num_tensors == len(LABELS)
    assert history.num_bytes == len(LABELS) * 2 * 5 * 4
    assert history.num_saved == len(LABELS) and history.num_saved_bytes == history.num_bytes
    assert history.num_stored_bytes == (len(LABELS) - 1) * 2 * 5 * 4  # the output shares mul's
    assert [p.label for p in history.param_passes] == [f"linear_1_1:{k}" for k in range(1, 5)]
    assert history.num_params == 30
    buffers = torchlog.log_forward_pass(WithBuffers(), torch.rand(2, 4))
    assert any(p.kind is NodeKind.BUFFER for p in buffers)
    assert all(p.is_buffer == (p.kind is NodeKind.BUFFER) for p in buffers)


def test_structure_facts(history: ModelHistory) -> None:
    assert history.max_passes == 4 and history.is_recurrent and not history.has_branching


def test_log_backward_fills_gradients(history: ModelHistory) -> None:
    assert history.layers_with_grads == []
    history.log_backward(history[-1].tensor_contents.sum())
    assert set(history.layers_with_grads) == set(LABELS)
    plain = torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5))
    with pytest.raises(InvalidOptionError, match="save_gradients=True"):
        plain.log_backward(plain[-1].tensor_contents.sum())


def test_to_pandas(history: ModelHistory) -> None:
    pytest.importorskip("pandas")
    frame = history.to_pandas()
    assert list(frame["label"]) == LABELS and frame["is_input"].tolist()[:2] == [True, False]


def test_to_dot_and_render_graph(history: ModelHistory, tmp_path: Path) -> None:
    pytest.importorskip("graphviz")
    source = history.to_dot(mode="rolled")
    assert "linear_1_1 (x4)" in source
    written = history.render_graph(outpath=str(tmp_path / "graph"), fileformat="gv")
    assert Path(str(written)).read_text() == history.to_dot()


def test_to_html_and_show(history: ModelHistory, tmp_path: Path) -> None:
    written = history.to_html(str(tmp_path / "view.html"), focus="fc")
    assert "linear_1_1" in Path(written).read_text()
    page = history.show(mode="rolled")
    assert "linear_1_1" in page._repr_html_()


def test_exports(history: ModelHistory, tmp_path: Path) -> None:
    assert "fc" in history.module_tree()
    assert list(history.cost_by_module()) == ["fc:1", "fc:2", "fc:3", "fc:4"]
    networkx = pytest.importorskip("networkx")
    graph = history.to_networkx(mode="rolled")
    assert isinstance(graph, networkx.MultiDiGraph) and "linear_1_1" in graph
    pytest.importorskip("onnx")
    assert Path(history.to_onnx(str(tmp_path / "graph.onnx"))).is_file()
    pytest.importorskip("tensorboard")
    assert Path(history.to_tensorboard(str(tmp_path / "runs"))).is_dir()


def test_save_round_trip(history: ModelHistory, tmp_path: Path) -> None:
    pytest.importorskip("h5py")
    path = history.save(str(tmp_path / "run.h5"))
    loaded = torchlog.load(path)
    assert loaded.keys() == history.keys() and loaded.items()[5][0] == LABELS[5]
    assert [p.kind for p in loaded] == [p.kind for p in history]
    assert loaded.info.num_gradient_hooks == len(LABELS)
    assert str(loaded["fc:2"]) == str(history["fc:2"])


def test_summary_str_and_repr(history: ModelHistory) -> None:
    assert history.summary() == str(history)
    assert str(history).startswith("Log of SimpleRecurrent forward pass:")
    assert repr(history) == "<ModelHistory of SimpleRecurrent: 14 passes, 5 layers>"
