"""mode='backward' (vis/autograd.py, vis/backward.py): the autograd graph rebuilt from the
records against torch's own graph, golden DOT, gradients on nodes, partial and loaded logs."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import torch

import torchlog
from tests.torchlog.export.histories import gpt2, logged, nested, partial, recurrent
from tests.golden_compare import check_golden
from tests.models import Branching, InPlace, MultiOutput, Nested, ReusedModule
from torchlog.vis.autograd import GRAD_OUTPUT, GRAD_PARAM, backward_graph

GOLDEN = Path(__file__).parent / "golden"


def _torch_graph(outputs) -> Counter:
    """Type names of every autograd node torch's graph reaches from `outputs`, as torchviz walks."""
    seen, stack = set(), [o.grad_fn for o in outputs if isinstance(o, torch.Tensor)]
    names: Counter = Counter()
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        names[type(fn).__name__] += 1
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return names


# Autograd nodes torch makes inside one call (the transpose in F.linear, the RNN layer in an
# LSTM); torchlog logs the call as one op, so its graph has one node for them.
INSIDE_ONE_CALL = ("TBackward0", "MkldnnRnnLayerBackward0")


@pytest.mark.parametrize("make", [
    lambda: (Nested(), torch.randn(2, 4)),
    lambda: (ReusedModule(), torch.randn(1, 4)),
    lambda: (Branching(), torch.randn(2, 4)),
    lambda: (InPlace(), torch.randn(2, 4)),
    lambda: (MultiOutput(), torch.randn(2, 4)),
], ids=["nested", "reused", "branching", "inplace", "multioutput"])
def test_nodes_match_torch_autograd_graph(make):
    torch.manual_seed(0)
    model, x = make()
    out = model(x.clone())
    expected = _torch_graph(out if isinstance(out, tuple) else (out,))
    for name in INSIDE_ONE_CALL:
        expected.pop(name, None)
    graph = backward_graph(logged(model, x.clone()))
    assert Counter(n.name for n in graph.nodes if n.kind != GRAD_OUTPUT) == expected


def test_nodes_tie_to_layers_modules_and_parameters():
    graph = backward_graph(nested())
    nodes = {n.key: n for n in graph.nodes}
    lin = nodes["linear_1_1"]
    assert (lin.name, lin.label, lin.module, lin.shape) == (
        "AddmmBackward0", "linear_1_1", "block1.inner.lin:1", (2, 4))
    weight = nodes["param block1.inner.lin.weight"]
    assert (weight.kind, weight.name, weight.shape) == (GRAD_PARAM, "AccumulateGrad", (4, 4))
    assert ("param block1.inner.lin.weight", "linear_1_1") in graph.edges
    assert ("layernorm_1_4", "add_2_7") in graph.edges  # the skip connection
    assert sum(n.kind == GRAD_PARAM for n in graph.nodes) == 10


def test_gradients_show_shape_and_norm():
    history = nested(save_gradients=True)
    history.log_backward(history[-1].tensor_contents.sum())
    nodes = {n.key: n for n in backward_graph(history).nodes}
    grad = history["relu_2_6"].grad_contents
    assert nodes["relu_2_6"].grad_shape == (2, 4)
    assert nodes["relu_2_6"].grad_norm == pytest.approx(grad.norm().item())
    # The label prints a float64 norm; torch's float32 norm may round the other way at 4 digits.
    label = r'"relu_2_6" \[label="[^"]*grad \(2, 4\), norm ([-+.e0-9]+)"'
    shown = re.search(label, history.to_dot(mode="backward"))
    assert shown is not None and float(shown.group(1)) == pytest.approx(grad.norm().item(), rel=1e-3)


def test_dot_matches_golden():
    check_golden(GOLDEN / "nested_backward.gv", nested().to_dot(mode="backward"))


def test_recurrent_graph_has_a_node_per_pass_and_one_leaf_per_parameter():
    graph = backward_graph(recurrent())
    assert [n.key for n in graph.nodes if n.kind == GRAD_PARAM] == ["param fc.weight", "param fc.bias"]
    assert sum(n.name == "AddmmBackward0" for n in graph.nodes) == 4
    assert ("mul_1_3:1", "linear_1_1:2") in graph.edges
    assert sum(1 for tail, _ in graph.edges if tail == "param fc.weight") == 4


def test_input_that_requires_grad_is_a_leaf():
    x = torch.randn(2, 4, requires_grad=True)
    graph = backward_graph(logged(ReusedModule(), x))
    assert graph.nodes[0].key == "input_1_0" and graph.nodes[0].name == "AccumulateGrad"


def test_partial_history_draws_what_ran():
    history = partial()
    graph = backward_graph(history)
    assert [n.key for n in graph.nodes] == ["param first.weight", "param first.bias",
                                            "linear_1_1", "relu_1_2"]
    assert 'label="ReluBackward0' in history.to_dot(mode="backward")


def test_history_loaded_from_hdf5_draws_the_same_graph(tmp_path):
    history = nested()
    loaded = torchlog.load(history.save(str(tmp_path / "run.h5")))
    assert loaded.to_dot(mode="backward") == history.to_dot(mode="backward")


def test_no_grad_history_has_an_empty_graph():
    with torch.no_grad():
        history = logged(ReusedModule(), torch.ones(1, 4))
    assert backward_graph(history).nodes == []


@pytest.mark.needs_dot
def test_render_writes_the_backward_graph(tmp_path):
    path = nested().render_graph(mode="backward", outpath=str(tmp_path / "bw"), fileformat="svg")
    assert path.endswith("bw.svg") and "AddmmBackward0" in Path(path).read_text()


def test_unknown_mode_lists_backward():
    with pytest.raises(torchlog.InvalidOptionError, match="'backward'.*got 'grad'"):
        nested().to_dot(mode="grad")


@pytest.mark.heavy
def test_gpt2_backward_graph_matches_torch():
    history, model, ids = gpt2()
    expected = _torch_graph((model(ids).logits,))
    ours = Counter(n.name for n in backward_graph(history).nodes if n.kind != GRAD_OUTPUT)
    assert not ours - expected  # every node we draw is one torch made
    assert ours["AccumulateGrad"] == expected["AccumulateGrad"]  # tied wte/lm_head weight once
    missing = expected - ours  # made inside one call (lm_head's linear on a 3-d input)
    assert set(missing) <= {"TBackward0", "MmBackward0", "ViewBackward0"}
