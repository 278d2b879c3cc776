"""Loop folding (torchlog/loops.py) on issue 15's reproducers and their neighbours: shared
parameters never split, nested parameter-free loops fold per program point, buffers rewritten
on each pass fold, and look-alikes that are not loops stay apart."""
from __future__ import annotations

from collections import defaultdict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlog
from tests.invariants import check_history
from tests.models import TINY_MODELS


def log(model: nn.Module, *inputs: torch.Tensor) -> torchlog.ModelHistory:
    """Log with seed 0 and check the shared invariants and the shared-parameter rule."""
    history = torchlog.log_forward_pass(model, list(inputs), random_seed=0)
    check_history(history)
    check_shared_parameters_fold(history)
    return history


def passes_of(history: torchlog.ModelHistory) -> dict[str, int]:
    """Layer label -> number of passes, for every layer in the history."""
    return {layer.label: layer.num_passes for layer in history.layers}


def check_shared_parameters_fold(history: torchlog.ModelHistory) -> None:
    """Every op applying the same parameters with the same function is in one layer.

    Raises:
        AssertionError: names the parameters and the layers they were split across.
    """
    layers: dict[tuple, set[str]] = defaultdict(set)
    for record in history:
        if record.params:
            key = (record.func_name, tuple(p.address for p in record.params), record.output_index)
            layers[key].add(record.layer_label)
    split = {key: sorted(labels) for key, labels in layers.items() if len(labels) > 1}
    assert not split, f"ops sharing parameters are in several layers: {split!r}"


# ----- shared parameters ---------------------------------------------------------------------
class OuterThenInner(nn.Module):
    """Issue 15: the outer Linear runs before the inner loop (the other order always passed)."""

    def __init__(self):
        super().__init__()
        self.outer = nn.Linear(6, 6)
        self.inner = nn.Linear(6, 6)

    def forward(self, x):
        for _ in range(3):
            x = torch.relu(self.outer(x))
            for _ in range(2):
                x = self.inner(x) * 0.5
        return x


class ThreeLevels(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        for _ in range(2):
            x = torch.relu(self.a(x))
            for _ in range(2):
                x = torch.sigmoid(self.b(x))
                for _ in range(3):
                    x = self.c(x) * 0.5
        return x


class TwoLinesOneLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        for _ in range(3):
            x = self.fc(x) + self.fc(x * 2)
        return x


class BeforeAndInsideLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        x = self.fc(x)
        for _ in range(3):
            x = torch.relu(self.fc(x))
        return x


class TwoLoopsOneLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        for _ in range(3):
            x = torch.sin(self.fc(x))
        for _ in range(2):
            x = torch.cos(self.fc(x))
        return x


class FunctionalWithModuleWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return F.linear(self.fc(x), self.fc.weight, self.fc.bias)


def test_outer_loop_first_keeps_the_inner_linear_one_layer():
    history = log(OuterThenInner(), torch.rand(2, 6))
    assert passes_of(history) == {"input_1_0": 1, "linear_1_1": 3, "relu_1_2": 3,
                                  "linear_2_3": 6, "mul_1_4": 6, "output_1_5": 1}
    one_outer = ["linear_1_1:{k}", "relu_1_2:{k}", "linear_2_3:{i}", "mul_1_4:{i}",
                 "linear_2_3:{j}", "mul_1_4:{j}"]
    expected = [label.format(k=k, i=2 * k - 1, j=2 * k) for k in (1, 2, 3) for label in one_outer]
    assert history.layer_labels == ["input_1_0", *expected, "output_1_5"]
    assert history.modules["inner"].num_passes == 6
    assert history["inner:4"].label == "linear_2_3:4"
    assert history["mul_1_4:3"].parent_labels == ("linear_2_3:3",)


def test_three_nested_levels_each_with_its_own_linear():
    history = log(ThreeLevels(), torch.rand(2, 4))
    assert passes_of(history) == {"input_1_0": 1, "linear_1_1": 2, "relu_1_2": 2,
                                  "linear_2_3": 4, "sigmoid_1_4": 4, "linear_3_5": 12,
                                  "mul_1_6": 12, "output_1_7": 1}
    assert history["linear_1_1:2"].parent_labels == ("mul_1_6:6",)


def test_one_linear_called_on_two_lines_of_a_loop_is_one_layer():
    history = log(TwoLinesOneLinear(), torch.rand(2, 4))
    assert passes_of(history) == {"input_1_0": 1, "linear_1_1": 6, "mul_1_2": 3, "add_1_3": 3,
                                  "output_1_4": 1}
    assert history["add_1_3:2"].parent_labels == ("linear_1_1:3", "linear_1_1:4")


def test_linear_called_before_and_inside_a_loop_is_one_layer():
    history = log(BeforeAndInsideLoop(), torch.rand(2, 4))
    assert passes_of(history) == {"input_1_0": 1, "linear_1_1": 4, "relu_1_2": 3, "output_1_3": 1}


def test_linear_shared_by_two_loops_is_one_layer_while_their_bodies_stay_apart():
    history = log(TwoLoopsOneLinear(), torch.rand(2, 4))
    assert passes_of(history) == {"input_1_0": 1, "linear_1_1": 5, "sin_1_2": 3, "cos_1_3": 2,
                                  "output_1_4": 1}


def test_functional_call_with_a_modules_weights_joins_the_modules_layer():
    history = log(FunctionalWithModuleWeights(), torch.rand(2, 4))
    assert history.layer_labels == ["input_1_0", "linear_1_1:1", "linear_1_1:2", "output_1_2"]


@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_shared_parameters_fold_in_every_tiny_model(name):
    cls, make_input = TINY_MODELS[name]
    torch.manual_seed(0)
    log(cls(), make_input())


# ----- nested loops without parameters -------------------------------------------------------
class CorrelationPyramid(nn.Module):
    """Issue 15's RAFT-like shape: a different constant per level, so the ops around the sin
    differ per level while the sin itself is one program point run 12 times."""

    def forward(self, x):
        coords = torch.zeros_like(x)
        for _ in range(4):
            scaled = coords - x
            accum = torch.zeros_like(x)
            for divisor in (2.0, 4.0, 8.0):
                accum = accum + torch.sin(scaled / divisor)
                scaled = scaled * 0.5
            coords = coords + torch.tanh(accum)
        return coords


class CorrelationPyramidReordered(nn.Module):
    def forward(self, x):
        coords = torch.zeros_like(x)
        for _ in range(4):
            accum = torch.zeros_like(x)
            scaled = coords - x
            for divisor in (2.0, 4.0, 8.0):
                scaled = scaled * 0.5
                accum = accum + torch.sin(scaled / divisor)
            coords = coords + torch.tanh(accum)
        return coords


class ThreeDeepNoParameters(nn.Module):
    def forward(self, x):
        for _ in range(2):
            for _ in range(2):
                for _ in range(2):
                    x = torch.sin(x) * 0.5
                x = torch.cos(x)
            x = torch.tanh(x)
        return x


def refine(t: torch.Tensor) -> torch.Tensor:
    for _ in range(3):
        t = torch.sin(t) * 2
    return t


class HelperLoopOnTwoInputs(nn.Module):
    def forward(self, a, b):
        return refine(a) + refine(b)


class HelperLoopChained(nn.Module):
    def forward(self, a):
        return refine(refine(a))


def test_correlation_pyramid_gives_one_sin_layer_of_12_and_one_tanh_of_4():
    history = log(CorrelationPyramid(), torch.rand(3))
    assert passes_of(history) == {
        "input_1_0": 1, "zeroslike_1_1": 1, "sub_1_2": 4, "zeroslike_2_3": 4, "div_1_4": 12,
        "sin_1_5": 12, "add_1_6": 12, "mul_1_7": 12, "tanh_1_8": 4, "add_2_9": 4, "output_1_10": 1}
    assert history["sin_1_5:5"].parent_labels == ("div_1_4:5",)
    assert history["tanh_1_8:2"].parent_labels == ("add_1_6:6",)
    assert history.layer("sin_1_5").child_layers["add_1_6"] == (tuple(range(1, 13)),) * 2


def test_correlation_pyramid_with_the_inner_ops_reordered():
    history = log(CorrelationPyramidReordered(), torch.rand(3))
    assert passes_of(history) == {
        "input_1_0": 1, "zeroslike_1_1": 1, "zeroslike_2_2": 4, "sub_1_3": 4, "mul_1_4": 12,
        "div_1_5": 12, "sin_1_6": 12, "add_1_7": 12, "tanh_1_8": 4, "add_2_9": 4, "output_1_10": 1}


def test_three_deep_loops_without_parameters():
    history = log(ThreeDeepNoParameters(), torch.rand(3))
    assert passes_of(history) == {"input_1_0": 1, "sin_1_1": 8, "mul_1_2": 8, "cos_1_3": 4,
                                  "tanh_1_4": 2, "output_1_5": 1}
    assert history["cos_1_3:3"].parent_labels == ("mul_1_2:6",)


def test_helper_loop_on_two_inputs_is_two_loops_not_one():
    history = log(HelperLoopOnTwoInputs(), torch.rand(3), torch.rand(3))
    assert passes_of(history) == {"input_1_0": 1, "input_2_1": 1, "sin_1_2": 3, "mul_1_3": 3,
                                  "sin_2_4": 3, "mul_2_5": 3, "add_1_6": 1, "output_1_7": 1}


def test_helper_loop_applied_twice_in_a_chain_is_one_loop():
    history = log(HelperLoopChained(), torch.rand(3))
    assert passes_of(history) == {"input_1_0": 1, "sin_1_1": 6, "mul_1_2": 6, "output_1_3": 1}


# ----- chains that read a new tensor each pass, and look-alikes ------------------------------
class SumOfList(nn.Module):
    def forward(self, a, b, c):
        return sum([a, b, c])  # one instruction, run three times in a chain


class AccumulateInputs(nn.Module):
    def forward(self, a, b, c):
        acc = torch.zeros_like(a)
        for t in (a, b, c):
            acc = acc + t
        return acc


class StepThroughUnbound(nn.Module):
    def forward(self, seq):
        h = torch.zeros_like(seq[0])
        for t in seq.unbind(0):
            h = torch.tanh(h + t)
        return h


class TwoAddsOnOneLine(nn.Module):
    def forward(self, x, a, b):
        return x + a + b


def test_builtin_sum_is_one_program_point_in_a_chain():
    history = log(SumOfList(), torch.rand(3), torch.rand(3), torch.rand(3))
    assert passes_of(history) == {"input_1_0": 1, "input_2_1": 1, "input_3_2": 1, "add_1_3": 3,
                                  "output_1_4": 1}


def test_loop_reading_a_different_input_each_pass_folds():
    history = log(AccumulateInputs(), torch.rand(3), torch.rand(3), torch.rand(3))
    assert passes_of(history) == {"input_1_0": 1, "input_2_1": 1, "input_3_2": 1,
                                  "zeroslike_1_3": 1, "add_1_4": 3, "output_1_5": 1}
    assert history["add_1_4:3"].parent_labels == ("add_1_4:2", "input_3_2")


def test_loop_over_unbound_steps_folds_while_the_unbind_outputs_stay_apart():
    history = log(StepThroughUnbound(), torch.rand(4, 3))
    counts = passes_of(history)
    assert counts["add_1_7"] == 4 and counts["tanh_1_8"] == 4
    assert [label for label in counts if label.startswith("unbind")] == [
        "unbind_1_3", "unbind_2_4", "unbind_3_5", "unbind_4_6"]  # four outputs of one call


def test_two_adds_on_one_line_are_two_layers():
    history = log(TwoAddsOnOneLine(), torch.rand(3), torch.rand(3), torch.rand(3))
    assert all(n == 1 for n in passes_of(history).values())


# ----- buffers rewritten on each pass ----------------------------------------------------------
class BufferModule(nn.Module):
    """A module with one buffer, `buf`, and a forward given per test case."""

    def __init__(self, forward) -> None:
        super().__init__()
        self.register_buffer("buf", torch.zeros(3))
        self.step = forward

    def forward(self, x):
        return self.step(self, x)


def _accumulate(self, x):
    for _ in range(4):
        self.buf = self.buf + x
    return self.buf


def _accumulate_and_double(self, x):
    for _ in range(4):
        self.buf = self.buf + x
        x = x * 2  # the last pass's result is never read
    return self.buf * 1


def _read_then_rewrite(self, x):
    for _ in range(4):
        x = torch.sin(x) * self.buf
        self.buf = self.buf + 1
    return x


def _in_place_update(self, x):
    for _ in range(4):
        self.buf.mul_(0.9).add_(x)
        x = torch.sin(x)
    return x + self.buf


def _running_average(self, x):
    for _ in range(4):
        mean = x.mean()
        self.buf = self.buf * 0.9 + mean * 0.1
        x = x - self.buf
    return x


class Accumulator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(3))

    def forward(self, x):
        self.total = self.total + x
        return self.total * 2


class AccumulatorInALoop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = Accumulator()

    def forward(self, x):
        for _ in range(4):
            x = self.cell(x)
        return x


@pytest.mark.parametrize("forward, expected", [
    (_accumulate, {"input_1_0": 1, "buffer_1_1": 1, "add_1_2": 4, "output_1_3": 1}),
    (_accumulate_and_double, {"input_1_0": 1, "buffer_1_1": 1, "add_1_2": 4, "mul_1_3": 4,
                              "mul_2_4": 1, "output_1_5": 1}),
    (_read_then_rewrite, {"input_1_0": 1, "sin_1_1": 4, "buffer_1_2": 1, "mul_1_3": 4,
                          "add_1_4": 4, "output_1_5": 1}),
    (_in_place_update, {"input_1_0": 1, "buffer_1_1": 1, "mul_1_2": 4, "add_1_3": 4,
                        "sin_1_4": 4, "add_2_5": 1, "output_1_6": 1}),
    (_running_average, {"input_1_0": 1, "mean_1_1": 4, "buffer_1_2": 1, "mul_1_3": 4,
                        "mul_2_4": 4, "add_1_5": 4, "sub_1_6": 4, "output_1_7": 1}),
], ids=["accumulate", "accumulate_and_double", "read_then_rewrite", "in_place_update",
        "running_average"])
def test_loop_rewriting_a_buffer_folds_every_pass(forward, expected):
    history = log(BufferModule(forward), torch.rand(3))
    assert passes_of(history) == expected


def test_module_rewriting_its_buffer_called_in_a_loop_folds():
    history = log(AccumulatorInALoop(), torch.rand(3))
    assert passes_of(history) == {"input_1_0": 1, "buffer_1_1": 1, "add_1_2": 4, "mul_1_3": 4,
                                  "output_1_4": 1}
    assert history.modules["cell"].num_passes == 4


# ----- ops inside Python functionals -----------------------------------------------------------
class SharedAttentionInALoop(nn.Module):
    """One attention module applied three times with a residual add: the ops of
    `F.multi_head_attention_forward`'s body are sited at the body's own instructions."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4)

    def forward(self, x):
        for _ in range(3):
            x = x + self.attn(x, x, x, need_weights=False)[0]
        return x


def test_ops_of_a_functional_called_in_a_loop_fold_across_its_calls():
    torch.manual_seed(0)
    history = log(SharedAttentionInALoop().eval(), torch.rand(5, 2, 16))
    counts = passes_of(history)
    assert counts["scaleddotproductattention_1_19"] == 3 and counts["add_1_24"] == 3
    # q, k and v: one instruction each of torch's _in_projection_packed, three layers
    assert [label for label in counts if label.startswith("getitem")] == ["getitem_1_7", "getitem_2_8",
                                                                           "getitem_3_9"]
    assert {label: n for label, n in counts.items() if n % 3} == {"input_1_0": 1, "output_1_25": 1}
    views = [label for label in counts if label.startswith("view")]
    assert len(views) == 7 and all(counts[label] == 3 for label in views)


# ----- ops that share one call site inside torch's own code --------------------------------------
class CrossAttentionInALoop(nn.Module):
    """nn.MultiheadAttention.forward (torch code) transposes query, key and value with one
    generator expression: one instruction, three values of different meaning per call."""

    def __init__(self, num_calls: int) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.num_calls = num_calls

    def forward(self, x, k, v):
        for _ in range(self.num_calls):
            x = x + self.attn(x, k, v, need_weights=False)[0]
        return x


def test_repeated_ops_of_one_torch_call_stay_apart_and_fold_across_calls():
    torch.manual_seed(0)
    inputs = (torch.rand(2, 3, 8), torch.rand(2, 5, 8), torch.rand(2, 5, 8))
    once = log(CrossAttentionInALoop(1), *inputs)
    thrice = log(CrossAttentionInALoop(3), *inputs)
    transposes = [p for p in once if p.func_name == "transpose" and "functionals" not in (p.extra or {})]
    # query, key, value to sequence-first, then the result back: four layers
    assert [p.shape for p in transposes] == [(3, 2, 8), (5, 2, 8), (5, 2, 8), (2, 3, 8)]
    assert len({p.label for p in transposes}) == 4
    assert [layer.label for layer in thrice.layers] == [layer.label for layer in once.layers]
    counts = passes_of(thrice)
    assert all(counts[label] == 3 for label in counts if not label.startswith(("input", "output")))


class GetitemInALoop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 6)

    def forward(self, x):
        for _ in range(4):
            x = torch.tanh(self.fc(x))[:, :4]
            x = torch.stack([x, -x])[1]
        return x


def test_a_getitem_in_a_real_loop_still_folds():
    counts = passes_of(log(GetitemInALoop(), torch.rand(2, 4)))
    assert counts == {"input_1_0": 1, "linear_1_1": 4, "tanh_1_2": 4, "getitem_1_3": 4, "neg_1_4": 4,
                      "stack_1_5": 4, "getitem_2_6": 4, "output_1_7": 1}
