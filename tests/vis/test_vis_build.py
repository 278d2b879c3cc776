"""What the drawn graph holds (vis/build.py, placement.py, edges.py, gradients.py)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlog
from tests.models import (
    Branching, CreatedInside, InPlace, Nested, ReusedModule, SimpleRecurrent, TrainEval, WithBuffers,
)
from torchlog.vis import RenderOptions
from torchlog.vis.build import FAILED_KEY, build_graph
from torchlog.vis.graph import (
    BUFFER, CREATED, FAILED, GRADIENT, INPUT, MODULE, OP, OUTPUT, PARAM, VisGraph,
)


def log(model: nn.Module, *inputs: torch.Tensor, **kwargs) -> torchlog.ModelHistory:
    return torchlog.log_forward_pass(model.eval(), list(inputs), random_seed=0, **kwargs)


def graph_of(history: torchlog.ModelHistory, **options) -> VisGraph:
    return build_graph(history, RenderOptions(**options))


def titles(graph: VisGraph) -> list[str]:
    return [node.lines[0] for node in graph.nodes]


def edges_between(graph: VisGraph, tail: str, head: str):
    return [e for e in graph.edges if e.tail == tail and e.head == head]


def test_recurrent_rolled_has_one_node_per_layer_with_pass_counts() -> None:
    history = log(SimpleRecurrent(), torch.rand(6, 5))
    graph = graph_of(history, mode="rolled")
    assert titles(graph) == ["input_1_0", "linear_1_1 (x4)", "add_1_2 (x4)", "mul_1_3 (x4)",
                             "output_1_4"]


def test_rolled_edges_say_which_passes_they_carry() -> None:
    graph = graph_of(log(SimpleRecurrent(), torch.rand(6, 5)), mode="rolled")
    (back,) = edges_between(graph, "mul_1_3", "linear_1_1")
    assert (back.taillabel, back.headlabel) == ("Out 1-3", "In 2-4")
    (first,) = edges_between(graph, "input_1_0", "linear_1_1")
    assert (first.taillabel, first.headlabel) == ("", "In 1")
    (last,) = edges_between(graph, "mul_1_3", "output_1_4")
    assert (last.taillabel, last.headlabel) == ("Out 4", "")
    (inner,) = edges_between(graph, "linear_1_1", "add_1_2")
    assert (inner.taillabel, inner.headlabel) == ("", "")


def test_unrolled_has_one_node_per_pass() -> None:
    history = log(SimpleRecurrent(), torch.rand(6, 5))
    graph = graph_of(history)
    assert [n.key for n in graph.nodes] == history.layer_labels
    assert len(graph.edges) == sum(len(p.parents) for p in history)


def test_nodes_show_label_shape_size_and_param_shapes() -> None:
    history = log(nn.Sequential(nn.Linear(3, 5)), torch.rand(2, 3))
    node = next(n for n in graph_of(history).nodes if n.key == "linear_1_1")
    assert node.lines == ("linear_1_1", "(2, 5), 40 B", "params: (5, 3), (5,)")
    assert node.kind == PARAM


def test_edges_carry_shapes_and_the_argument_when_order_matters() -> None:
    graph = graph_of(log(Branching(), torch.rand(2, 4)))
    labels = {(e.tail, e.head): e.label for e in graph.edges}
    assert labels[("relu_1_2", "cat_1_5")] == "(2, 4)\narg 0[0]"
    assert labels[("sigmoid_1_4", "cat_1_5")] == "(2, 4)\narg 0[1]"
    assert labels[("cat_1_5", "sub_1_7")] == "(2, 8)\narg 0"
    assert labels[("repeat_1_6", "sub_1_7")] == "(2, 8)\narg 1"
    assert labels[("input_1_0", "linear_1_1")] == "(2, 4)"


def test_symmetric_ops_do_not_name_arguments() -> None:
    graph = graph_of(log(InPlace(), torch.randn(3, 4)))
    into_add = [e.label for e in graph.edges if e.head == "add_2_6"]
    assert sorted(into_add) == ["(3, 4)", "(3, 4)"]


def test_node_kinds_tell_tensors_apart() -> None:
    kinds = {n.key: n.kind for n in graph_of(log(CreatedInside(), torch.randn(2, 4))).nodes}
    assert kinds["input_1_0"] == INPUT and kinds["output_1_18"] == OUTPUT
    assert kinds["ones_1_2"] == CREATED and kinds["tensor_2_10"] == CREATED
    assert kinds["add_1_3"] == OP
    inplace = {n.key for n in graph_of(log(InPlace(), torch.randn(3, 4))).nodes if n.is_inplace}
    assert inplace == {"relu_1_2", "add_1_3", "mul_2_5"}


def test_buffers_are_hidden_unless_asked_for() -> None:
    history = log(WithBuffers(), torch.randn(2, 4))
    hidden = graph_of(history)
    assert not any(n.kind == BUFFER for n in hidden.nodes)
    assert not any(e.tail.startswith("buffer") for e in hidden.edges)
    shown = graph_of(history, show_buffers=True)
    buffers = [n for n in shown.nodes if n.kind == BUFFER]
    assert [n.lines[1] for n in buffers] == ["calls", "scale"]
    assert edges_between(shown, "buffer_2_4", "mul_1_5")


@pytest.mark.parametrize("direction, rankdir", [("bottomup", "BT"), ("topdown", "TB"),
                                                ("leftright", "LR")])
def test_direction(direction: str, rankdir: str) -> None:
    assert graph_of(log(Branching(), torch.rand(2, 4)), direction=direction).rankdir == rankdir


def test_modules_become_nested_boxes() -> None:
    graph = graph_of(log(Nested(), torch.rand(2, 4)))
    boxes = {key: (c.label, c.parent, c.depth) for key, c in graph.clusters.items()}
    assert boxes["block1:1"] == ("block1 (Middle)", None, 1)
    assert boxes["block1.inner:1"] == ("block1.inner (Inner)", "block1:1", 2)
    assert boxes["block1.inner.lin:1"] == ("block1.inner.lin (Linear)", "block1.inner:1", 3)
    placed = {n.key: n.cluster for n in graph.nodes}
    assert placed["linear_1_1"] == "block1.inner.lin:1"
    assert placed["add_1_3"] == "block1:1"
    assert placed["input_1_0"] is None


def test_box_titles_carry_call_numbers() -> None:
    history = log(ReusedModule(), torch.randn(2, 4))
    unrolled = graph_of(history).clusters
    assert [unrolled[k].label for k in ("cell:1", "cell:3")] == ["cell:1 (Linear)", "cell:3 (Linear)"]
    assert graph_of(history, mode="rolled").clusters["cell"].label == "cell (Linear) x3"


def test_depth_one_draws_only_top_level_blocks() -> None:
    history = log(Nested(), torch.rand(2, 4))
    graph = graph_of(history, nesting_depth=1)
    assert [n.key for n in graph.nodes] == [
        "input_1_0", "module block1:1", "module block2:1", "module head:1", "output_1_10"]
    assert graph.clusters == {}
    block = next(n for n in graph.nodes if n.key == "module block1:1")
    assert block.kind == MODULE
    assert block.lines == ("block1 (Middle)", "(2, 4)",
                           f"params: {sum(p.numel() for p in Nested().block1.parameters())}")
    assert [(e.tail, e.head) for e in graph.edges] == [
        ("input_1_0", "module block1:1"), ("module block1:1", "module block2:1"),
        ("module block2:1", "module head:1"), ("module head:1", "output_1_10")]


def test_depth_two_keeps_top_boxes_and_collapses_below() -> None:
    graph = graph_of(log(Nested(), torch.rand(2, 4)), nesting_depth=2)
    assert set(graph.clusters) == {"block1:1", "block2:1", "head:1"}
    keys = {n.key: n.cluster for n in graph.nodes}
    assert keys["module block1.inner:1"] == "block1:1"
    assert keys["module block1.norm:1"] == "block1:1"
    assert keys["add_1_3"] == "block1:1"
    assert keys["linear_3_9"] == "head:1"  # a top-level leaf module is still a box at depth 2


def test_rolled_depth_limit_merges_module_calls() -> None:
    graph = graph_of(log(ReusedModule(), torch.randn(2, 4)), mode="rolled", nesting_depth=1)
    assert titles(graph) == ["input_1_0", "cell (Linear) x3", "act (Tanh) x3", "output_1_3"]
    assert edges_between(graph, "module act", "module cell")


def test_partial_history_draws_the_failing_op_in_red() -> None:
    class Fails(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 3), nn.Linear(4, 2)

        def forward(self, x):
            return self.b(self.a(x))

    history = log(Fails(), torch.rand(2, 4), on_error="return")
    assert history.info.is_partial
    graph = graph_of(history)
    failed = graph.nodes[-1]
    assert (failed.key, failed.kind) == (FAILED_KEY, FAILED)
    assert "linear" in " ".join(failed.lines) and "'b'" in " ".join(failed.lines)
    assert [(e.tail, e.label) for e in graph.edges if e.head == FAILED_KEY] == [("linear_1_1", "(2, 3)")]


def test_gradient_edges_run_backwards_where_gradients_are_held() -> None:
    history = log(nn.Sequential(nn.Linear(3, 3), nn.ReLU()), torch.rand(2, 3))
    assert not [e for e in graph_of(history).edges if e.kind == GRADIENT]
    history["linear_1_1"].grad_contents = torch.ones(2, 3)
    graph = graph_of(history)
    grads = [(e.tail, e.head, e.label) for e in graph.edges if e.kind == GRADIENT]
    assert grads == [("relu_1_2", "linear_1_1", "(2, 3)")]
    assert not [e for e in graph_of(history, show_gradients=False).edges if e.kind == GRADIENT]


def test_legend_caption_lists_model_facts() -> None:
    history = log(TrainEval(), torch.rand(5, 4))
    caption = graph_of(history).caption
    num_params = sum(p.numel() for p in TrainEval().parameters())
    assert caption[0] == "TrainEval"
    assert f"{len(history)} tensors" in caption[1] and f"{num_params} params" in caption[1]
    assert graph_of(history, show_legend=False).caption == ()


def test_building_leaves_the_history_unchanged() -> None:
    history = log(Nested(), torch.rand(2, 4))
    before = [(p.label, p.parents, p.children) for p in history]
    graph_of(history, nesting_depth=1, mode="rolled")
    assert [(p.label, p.parents, p.children) for p in history] == before


def test_gradient_edges_from_a_real_backward_pass() -> None:
    history = log(Branching(), torch.randn(2, 4, requires_grad=True), save_gradients=True)
    history.log_backward(history[-1].tensor_contents.sum())
    graph = graph_of(history)
    grads = {(e.tail, e.head) for e in graph.edges if e.kind == GRADIENT}
    expected = {(child, p.label) for p in history if p.grad_contents is not None
                for child in p.children}
    assert grads == expected and ("sub_1_7", "cat_1_5") in grads
