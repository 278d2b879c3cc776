"""history.to_networkx (torchlog/export/networkx_graph.py): nodes, edges, attributes, analysis."""
from __future__ import annotations

import sys

import networkx as nx
import pytest
import torch

import torchlog
from tests.torchlog.export.histories import gpt2, logged, nested, partial, recurrent
from tests.invariants import ancestors
from tests.models import DoubleUse


def _argument_edges(history) -> int:
    present = {p.label for p in history}
    return sum(1 for p in history for e in p.parents if e.label in present)


def test_unrolled_has_a_node_per_pass_and_an_edge_per_argument():
    history = nested()
    graph = history.to_networkx()
    assert isinstance(graph, nx.MultiDiGraph)
    assert list(graph.nodes) == history.layer_labels
    assert graph.number_of_edges() == _argument_edges(history) == 12  # 10 along the chain, 2 skips
    assert nx.is_directed_acyclic_graph(graph)
    assert graph.graph["model_name"] == "Nested" and graph.graph["is_partial"] is False


def test_node_attributes_are_the_record_fields():
    history = nested()
    node = history.to_networkx().nodes["linear_1_1"]
    record = history["linear_1_1"]
    assert node["function"] == "linear" and node["kind"] == "op"
    assert node["shape"] == (2, 4) and node["dtype"] == "torch.float32" and node["num_bytes"] == 32
    assert node["module"] == "block1.inner.lin"
    assert node["modules"] == ("block1", "block1.inner", "block1.inner.lin")
    assert node["module_calls"] == ("block1:1", "block1.inner:1", "block1.inner.lin:1")
    assert node["params"] == ("block1.inner.lin.weight", "block1.inner.lin.bias")
    assert node["num_params"] == 20 and node["grad_fn"] == "AddmmBackward0"
    assert node["call_site"] == record.call_site and "models.py" in node["call_site"]
    assert node["elapsed_s"] == record.elapsed_s > 0
    assert node["pass_num"] == node["num_passes"] == 1
    assert "value" not in node


def test_edges_carry_argument_position_shape_and_dtype():
    graph = logged(DoubleUse(), torch.ones(3)).to_networkx()
    # x + x: the one parent is passed twice, so two parallel edges, arguments 0 and 1
    assert sorted(graph.get_edge_data("input_1_0", "add_1_1").values(), key=lambda d: d["arg"]) == [
        {"arg": 0, "shape": (3,), "dtype": "torch.float32"},
        {"arg": 1, "shape": (3,), "dtype": "torch.float32"}]


def test_networkx_algorithms_work_on_the_graph():
    history = nested()
    graph = history.to_networkx()
    longest = nx.dag_longest_path(graph)
    assert longest[0] == "input_1_0" and longest[-1] == "output_1_10" and len(longest) == 11
    assert nx.ancestors(graph, "add_2_7") | {"add_2_7"} == ancestors(history, ["add_2_7"])
    block1 = graph.subgraph(n for n, modules in graph.nodes(data="modules") if "block1" in modules)
    assert sorted(block1.nodes) == ["add_1_3", "layernorm_1_4", "linear_1_1", "relu_1_2"]
    time_per_module: dict[str, float] = {}
    for _, data in graph.nodes(data=True):
        for module in data["modules"]:
            time_per_module[module] = time_per_module.get(module, 0.0) + data["elapsed_s"]
    assert time_per_module["block1"] == pytest.approx(
        sum(graph.nodes[n]["elapsed_s"] for n in block1.nodes))


def test_values_are_the_saved_activations_when_asked_for():
    history = nested()
    graph = history.to_networkx(include_values=True)
    for record in history:
        assert torch.equal(graph.nodes[record.label]["value"], record.tensor_contents)


def test_rolled_has_a_node_per_layer_and_the_loop_as_a_cycle():
    history = recurrent()
    graph = history.to_networkx(mode="rolled")
    assert list(graph.nodes) == ["input_1_0", "linear_1_1", "add_1_2", "mul_1_3", "output_1_4"]
    linear = graph.nodes["linear_1_1"]
    assert linear["num_passes"] == 4 and linear["shapes"] == ((1, 5),) * 4
    assert linear["elapsed_s"] == pytest.approx(sum(p.elapsed_s for p in history.layer("linear_1_1")))
    back = graph.get_edge_data("mul_1_3", "linear_1_1")
    assert [d["passes"] for d in back.values()] == [((1, 2), (2, 3), (3, 4))]
    assert ["linear_1_1", "add_1_2", "mul_1_3"] in [sorted(c, key=list(graph).index)
                                                   for c in nx.simple_cycles(graph)]
    values = history.to_networkx(mode="rolled", include_values=True).nodes["add_1_2"]["value"]
    assert len(values) == 4 and torch.equal(values[2], history["add_1_2:3"].tensor_contents)


def test_unrolled_recurrent_names_each_pass():
    graph = recurrent().to_networkx()
    assert graph.number_of_nodes() == 14 and nx.is_directed_acyclic_graph(graph)
    assert graph.nodes["linear_1_1:3"]["pass_num"] == 3
    assert graph.nodes["linear_1_1:3"]["num_passes"] == 4


def test_partial_history_exports_what_ran():
    history = partial()
    graph = history.to_networkx()
    assert list(graph.nodes) == ["input_1_0", "linear_1_1", "relu_1_2"]
    assert graph.graph["is_partial"] is True and "second" in graph.graph["failure"]


def test_pruned_history_drops_edges_to_passes_left_out():
    history = nested(layers_to_save=["linear_1_1", "add_1_3", "output"])
    graph = history.to_networkx()
    # The output's parent linear_3_9 was left out, so no edge remains.
    assert list(graph.nodes) == ["linear_1_1", "add_1_3", "output_1_10"] and graph.number_of_edges() == 0


def test_history_loaded_from_hdf5_gives_the_same_graph(tmp_path):
    history = nested()
    loaded = torchlog.load(history.save(str(tmp_path / "run.h5")))
    ours, theirs = history.to_networkx(), loaded.to_networkx(include_values=True)
    assert list(ours.nodes(data="shape")) == list(theirs.nodes(data="shape"))
    assert list(ours.edges(data="arg")) == list(theirs.edges(data="arg"))
    assert torch.equal(theirs.nodes["add_2_7"]["value"], history["add_2_7"].tensor_contents)


@pytest.mark.parametrize("mode", ["backward", "Rolled", None, 1])
def test_unknown_mode_names_the_value(mode):
    with pytest.raises(torchlog.InvalidOptionError, match=repr(mode)):
        nested().to_networkx(mode=mode)


def test_values_of_a_history_without_saved_activations_is_an_error():
    history = nested(layers_to_save=None)
    with pytest.raises(torchlog.InvalidOptionError, match="include_values=True.*layers_to_save"):
        history.to_networkx(include_values=True)
    assert history.to_networkx().number_of_nodes() == 11  # without values it works
    with pytest.raises(torchlog.InvalidArgumentTypeError, match="'yes'"):
        history.to_networkx(include_values="yes")


def test_missing_networkx_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "networkx", None)
    with pytest.raises(torchlog.MissingDependencyError, match=r"torchlog\[networkx\]"):
        nested().to_networkx()


@pytest.mark.heavy
def test_gpt2_graph():
    history, _, _ = gpt2()
    graph = history.to_networkx()
    assert graph.number_of_nodes() == len(history)
    assert graph.number_of_edges() == _argument_edges(history)
    assert nx.is_directed_acyclic_graph(graph)
    assert nx.dag_longest_path(graph)[-1] == history.output_layers[0]
    attn = [n for n, modules in graph.nodes(data="modules") if "transformer.h.1.attn" in modules]
    assert attn and all(graph.nodes[n]["module"].startswith("transformer.h.1.attn") for n in attn)
    rolled = history.to_networkx(mode="rolled")
    assert rolled.number_of_nodes() == len(history.layers)
