"""Ops inside torch.nn.functional functions written in Python are nodes, each call a scope."""
from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlog
from tests.models import Func

MHA_OPS = [
    "linear_1_1", "unflatten_1_2", "unsqueeze_1_3", "transpose_1_4", "squeeze_1_5",
    "contiguous_1_6", "getitem_1_7", "getitem_2_8", "getitem_3_9", "view_1_10", "transpose_2_11",
    "view_2_12", "transpose_3_13", "view_3_14", "transpose_4_15", "mul_1_16", "transpose_5_17",
    "bmm_1_18", "softmax_1_19", "bmm_2_20", "transpose_6_21", "reshape_1_22", "linear_2_23",
    "view_4_24", "view_5_25", "mean_1_26",
]


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.attn(x, x, x, need_weights=True)


def _log(model: nn.Module, x: torch.Tensor) -> torchlog.ModelHistory:
    history = torchlog.log_forward_pass(model, x, random_seed=0)
    torchlog.lint(history)
    return history


def _scopes(history: torchlog.ModelHistory) -> list:
    return [p.extra.get("functionals") for p in history]


def test_multihead_attention_ops_are_nodes_and_the_weights_are_saved() -> None:
    torch.manual_seed(0)
    model, x = Attention(), torch.rand(5, 2, 16)
    history = _log(model, x)
    assert history.layer_labels == ["input_1_0", *MHA_OPS, "output_1_27", "output_2_28"]
    assert _scopes(history) == [None] + [["attn.multi_head_attention_forward:1"]] * 26 + [None] * 2
    assert list(history.modules) == ["attn", "attn.out_proj"]
    assert history.modules["attn"].call_outputs == (("view_4_24", "mean_1_26"),)
    out, weights = model.attn(x, x, x, need_weights=True)
    assert torch.equal(history["mean_1_26"].tensor_contents, weights)
    assert torch.equal(history["view_4_24"].tensor_contents, out)
    assert history["softmax_1_19"].shape == (8, 5, 5)  # per head, before the mean
    in_proj = history["linear_1_1"]
    assert [p.address for p in in_proj.params] == ["attn.in_proj_weight", "attn.in_proj_bias"]


def test_multihead_attention_weights_per_head() -> None:
    torch.manual_seed(0)
    mha, x = nn.MultiheadAttention(16, 4, batch_first=True), torch.rand(2, 5, 16)
    model = Func(lambda t: mha(t, t, t, average_attn_weights=False)[1])
    history = _log(model, x)
    weights = mha(x, x, x, average_attn_weights=False)[1]
    assert history.layer_labels[-3:] == ["view_5_30", "transpose_8_31", "output_1_32"]
    assert history[-1].parent_labels == ("view_5_30",)  # transpose_8_31: the unused output, batch first
    assert torch.equal(history["view_5_30"].tensor_contents, weights)


def test_transformer_encoder_layer_without_fast_path() -> None:
    torch.manual_seed(0)
    layer, x = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0).eval(), torch.rand(5, 2, 16)
    with torch.no_grad():
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            history = _log(layer, x)
            expected = layer(x)
        finally:
            torch.backends.mha.set_fastpath_enabled(True)
    labels = history.layer_labels
    assert labels[:4] == ["input_1_0", "linear_1_1", "unflatten_1_2", "unsqueeze_1_3"]
    assert "scaleddotproductattention_1_19" in labels and labels[-1] == "output_1_34"
    inside = [p.label for p in history if p.extra.get("functionals") == ["self_attn.multi_head_attention_forward:1"]]
    assert inside[0] == "linear_1_1" and inside[-1] == "view_7_23" and len(inside) == 23
    assert torch.equal(history[-1].tensor_contents, expected)
    assert list(history.modules)[:2] == ["self_attn", "self_attn.out_proj"]


@pytest.mark.parametrize(("name", "func", "labels"), [
    ("normalize", lambda x: F.normalize(x, dim=1),
     ["norm_1_1", "clampmin_1_2", "expandas_1_3", "div_1_4"]),
    ("gumbel_softmax", lambda x: F.gumbel_softmax(x, tau=0.5),
     ["emptylike_1_1", "exponential_1_2", "log_1_3", "neg_1_4", "add_1_5", "div_1_6", "softmax_1_7"]),
])
def test_python_functional_ops_are_nodes_of_one_scope(name: str, func: Callable, labels: list) -> None:
    x = torch.rand(3, 4)
    history = _log(Func(func), x)
    assert history.layer_labels == ["input_1_0", *labels, f"output_1_{len(labels) + 1}"]
    assert _scopes(history) == [None] + [[f"{name}:1"]] * len(labels) + [None]
    torch.manual_seed(0)
    assert torch.equal(history[-1].tensor_contents, func(x))


def test_gumbel_softmax_hard_runs_its_straight_through_ops() -> None:
    x = torch.rand(3, 4)
    history = _log(Func(lambda t: F.gumbel_softmax(t, tau=0.5, hard=True)), x)
    assert history.layer_labels[7:] == ["softmax_1_7", "max_1_8", "max_2_9", "zeroslike_1_10",
                                        "scatter_1_11", "detach_1_12", "sub_1_13", "add_2_14",
                                        "output_1_15"]
    torch.manual_seed(0)
    assert torch.equal(history[-1].tensor_contents, F.gumbel_softmax(x, tau=0.5, hard=True))


def test_a_functional_whose_work_is_one_cpp_op_stays_one_node() -> None:
    theta = torch.rand(2, 2, 3)
    history = _log(Func(lambda t: F.affine_grid(t, [2, 1, 3, 4], align_corners=False)), theta)
    assert history.layer_labels == ["input_1_0", "affinegrid_1_1", "output_1_2"]
    assert history["affinegrid_1_1"].func_name == "affine_grid"
    assert _scopes(history) == [None, None, None]
    assert torch.equal(history[1].tensor_contents, F.affine_grid(theta, [2, 1, 3, 4], align_corners=False))


def test_one_op_functionals_keep_their_name_arguments_and_parents() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 4)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return F.relu(F.layer_norm(self.emb(ids), (4,))).softmax(-1)

    history = torchlog.log_forward_pass(Net(), torch.tensor([[1, 2, 3]]), random_seed=0,
                                        save_function_args=True)
    torchlog.lint(history)
    assert history.layer_labels == ["input_1_0", "embedding_1_1", "layernorm_1_2", "relu_1_3",
                                    "softmax_1_4", "output_1_5"]
    assert [p.func_name for p in history][1:5] == ["embedding", "layer_norm", "relu", "softmax"]
    embedding = history["embedding_1_1"]
    assert embedding.func_args[0] is F.embedding
    assert [(e.label, e.arg) for e in embedding.parents] == [("input_1_0", 0)]
    assert history["layernorm_1_2"].func_args[0] is F.layer_norm
    assert all("functionals" not in p.extra for p in history)


def test_multihead_attention_replays() -> None:
    torch.manual_seed(0)
    assert torchlog.validate_saved_activations(Attention(), torch.rand(5, 2, 16), random_seed=0)


def test_ops_of_a_functional_called_in_a_loop_fold_per_instruction() -> None:
    """Each op of the body is sited at its own instruction of the body, so its passes fold
    across the loop's calls, while different instructions stay different layers: three
    calls give the layers of one call, each with three passes. The q, k and v getitems of
    torch's `_in_projection_packed` (sited at the one body instruction that calls it) stay
    three layers."""

    class Loop(nn.Module):
        def __init__(self, num_calls: int) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(8, 2)
            self.num_calls = num_calls

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(self.num_calls):
                x = self.attn(x, x, x, need_weights=False)[0]
            return x

    once = _log(Loop(1), torch.rand(4, 2, 8))
    history = _log(Loop(3), torch.rand(4, 2, 8))
    assert len(history) == 3 * (len(once) - 2) + 2
    assert [layer.label for layer in history.layers] == [layer.label for layer in once.layers]
    getitems = [layer for layer in history.layers if layer.layer_type == "getitem"]
    assert [layer.label for layer in getitems] == ["getitem_1_7", "getitem_2_8", "getitem_3_9"]
    # the k-th getitem of every call takes the k-th row of the projection: q, k or v
    for row, layer in enumerate(getitems):
        for record in layer.passes:
            (parent,) = record.parent_labels
            assert torch.equal(record.tensor_contents, history[parent].tensor_contents[row])
    views = [layer for layer in history.layers if layer.layer_type == "view"]
    assert len(views) == 7 and all(len(layer.passes) == 3 for layer in views)
    assert history[views[0].label + ":1"].call_site.endswith("in multi_head_attention_forward")
    assert all(len(layer.passes) % 3 == 0 for layer in history.layers if layer.layer_type != "output"
               and layer.layer_type != "input")
