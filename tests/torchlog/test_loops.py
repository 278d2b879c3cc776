"""Loop folding (torchlog/loops.py): which repeated ops become passes of one layer."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlog
from tests.invariants import check_history
from tests.models import SimpleRecurrent


def log(model: nn.Module, *inputs: torch.Tensor, **kwargs) -> torchlog.ModelHistory:
    kwargs.setdefault("random_seed", 0)
    history = torchlog.log_forward_pass(model, list(inputs), **kwargs)
    check_history(history)
    return history


def passes_of(history: torchlog.ModelHistory) -> dict[str, int]:
    """Layer label -> number of passes, for every layer in the history."""
    return {layer.label: layer.num_passes for layer in history.layers}


class SinMulLoop(nn.Module):
    def forward(self, x):
        for _ in range(4):
            x = torch.sin(x)
            x = x * 2
        return x


class SameOpsParallel(nn.Module):
    """The same op sequence applied once to each of three inputs: not a loop."""

    def forward(self, a, b, c):
        outs = []
        for t in (a, b, c):
            outs.append(torch.sin(t) * 2)
        return outs[0] + outs[1] + outs[2]


class ChangingBody(nn.Module):
    """An extra op on even passes only."""

    def forward(self, x):
        for i in range(4):
            x = torch.sin(x)
            x = x * 2
            if i % 2 == 1:
                x = torch.cos(x)
        return x


class ModuleInsideAndOutside(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.ReLU()

    def forward(self, x):
        x = self.act(x)
        for _ in range(3):
            x = self.act(x * 2)
        return x


class ModuleReluBesideFunctional(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.ReLU()

    def forward(self, x):
        for _ in range(3):
            x = self.act(x) - 1
            x = torch.relu(x) + 1
        return x


class NearlyRepeating(nn.Module):
    """A long run of sin between different ops: sin repeats, the body never does."""

    def forward(self, x):
        for op in (torch.cos, torch.tanh, torch.exp, torch.sigmoid, torch.abs, torch.neg):
            x = torch.sin(x)
            x = op(x)
        return x


class NestedLoops(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.outer = nn.Linear(4, 4)

    def forward(self, x):
        for _ in range(3):
            for _ in range(2):
                x = torch.tanh(self.inner(x))
            x = self.outer(x) + x
        return x


class RandomStop(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        steps = 0
        while True:
            x = torch.sigmoid(self.fc(x))
            steps += 1
            if torch.rand(()) < 0.3 or steps == 20:
                return x


class NewTensorsEachPass(nn.Module):
    def forward(self, x):
        for _ in range(4):
            x = x + torch.rand(x.shape) * 0 + torch.ones(x.shape)
        return x


class AppendEachPass(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        outs = []
        for _ in range(3):
            x = torch.relu(self.fc(x))
            outs.append(x * 10)
        return outs


class CellLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(3, 5)

    def forward(self, seq):
        h = torch.zeros(seq.shape[1], 5)
        c = torch.zeros(seq.shape[1], 5)
        for t in range(seq.shape[0]):
            h, c = self.cell(seq[t], (h, c))
        return h


def test_seed_simple_recurrent_folds_into_four_passes():
    history = log(SimpleRecurrent(), torch.rand(6, 5))
    assert passes_of(history) == {
        "input_1_0": 1, "linear_1_1": 4, "add_1_2": 4, "mul_1_3": 4, "output_1_4": 1}
    assert history.layer_labels[1:4] == ["linear_1_1:1", "add_1_2:1", "mul_1_3:1"]


def test_seed_simple_recurrent_rolled_edges_say_which_passes():
    history = log(SimpleRecurrent(), torch.rand(6, 5))
    linear = history.layer("linear_1_1")
    assert linear.child_layers["add_1_2"] == ((1, 2, 3, 4), (1, 2, 3, 4))
    mul = history.layer("mul_1_3")
    assert mul.child_layers["linear_1_1"] == ((1, 2, 3), (2, 3, 4))
    assert linear.parent_layers["mul_1_3"] == ((1, 2, 3), (2, 3, 4))
    assert linear.parent_layers["input_1_0"] == ((1,), (1,))
    assert [p.label for p in linear.passes] == [f"linear_1_1:{k}" for k in range(1, 5)]


def test_param_free_loop_folds():
    history = log(SinMulLoop(), torch.rand(3))
    assert passes_of(history) == {"input_1_0": 1, "sin_1_1": 4, "mul_1_2": 4, "output_1_3": 1}


def test_same_ops_on_three_inputs_are_not_a_loop():
    history = log(SameOpsParallel(), torch.rand(3), torch.rand(3), torch.rand(3))
    assert all(n == 1 for n in passes_of(history).values())
    assert [l for l in history.layer_labels if l.startswith(("sin", "mul"))] == [
        "sin_1_3", "mul_1_4", "sin_2_5", "mul_2_6", "sin_3_7", "mul_3_8"]


def test_changing_body_keeps_extra_op_as_its_own_layer():
    history = log(ChangingBody(), torch.rand(3))
    assert passes_of(history) == {
        "input_1_0": 1, "sin_1_1": 4, "mul_1_2": 4, "cos_1_3": 2, "output_1_4": 1}
    assert history["cos_1_3:1"].parent_labels == ("mul_1_2:2",)
    assert history["cos_1_3:2"].parent_labels == ("mul_1_2:4",)


def test_module_called_inside_and_outside_loop_stays_distinct():
    history = log(ModuleInsideAndOutside(), torch.rand(3))
    assert passes_of(history) == {
        "input_1_0": 1, "relu_1_1": 1, "mul_1_2": 3, "relu_2_3": 3, "output_1_4": 1}
    assert history.modules["act"].num_passes == 4


def test_module_relu_and_functional_relu_in_one_loop_stay_distinct():
    history = log(ModuleReluBesideFunctional(), torch.rand(3))
    assert passes_of(history) == {
        "input_1_0": 1, "relu_1_1": 3, "sub_1_2": 3, "relu_2_3": 3, "add_1_4": 3, "output_1_5": 1}
    assert history["relu_1_1:2"].containing_modules == ("act:2",)
    assert history["relu_2_3:2"].containing_modules == ()


def test_nearly_repeating_param_free_run_is_not_folded():
    history = log(NearlyRepeating(), torch.rand(3))
    assert all(n == 1 for n in passes_of(history).values())
    assert len(history) == 14


def test_nested_loops_fold():
    history = log(NestedLoops(), torch.rand(2, 4))
    assert passes_of(history) == {
        "input_1_0": 1, "linear_1_1": 6, "tanh_1_2": 6, "linear_2_3": 3, "add_1_4": 3, "output_1_5": 1}
    assert history.layer("linear_2_3").parent_layers["tanh_1_2"] == ((2, 4, 6), (1, 2, 3))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_random_stop_pass_count_follows_the_run(seed):
    history = log(RandomStop(), torch.rand(2, 3), random_seed=seed)
    torch.manual_seed(seed)
    RandomStop()  # same construction order is irrelevant: count steps directly
    n = history.layer("linear_1_1").num_passes
    assert n == history.modules["fc"].num_passes
    assert passes_of(history)["sigmoid_1_2"] == n
    assert sum(1 for p in history if p.layer_type == "rand") == n


def test_new_tensors_created_each_pass_fold():
    history = log(NewTensorsEachPass(), torch.rand(3))
    counts = passes_of(history)
    assert counts == {"input_1_0": 1, "rand_1_1": 4, "mul_1_2": 4, "add_1_3": 4, "ones_1_4": 4,
                      "add_2_5": 4, "output_1_6": 1}


def test_outputs_appended_each_pass_fold():
    history = log(AppendEachPass(), torch.rand(2, 3))
    counts = passes_of(history)
    assert counts["linear_1_1"] == 3 and counts["relu_1_2"] == 3 and counts["mul_1_3"] == 3
    assert history.output_layers == ["output_1_4", "output_2_5", "output_3_6"]
    assert [history[o].parent_labels for o in history.output_layers] == [
        ("mul_1_3:1",), ("mul_1_3:2",), ("mul_1_3:3",)]


def test_lstm_and_gru_called_once_are_single_ops():
    for module in (nn.LSTM(3, 4), nn.GRU(3, 4)):
        history = log(module, torch.rand(5, 2, 3))
        ops = [p for p in history if not (p.is_input or p.is_output)]
        kinds = {p.layer_type for p in ops}
        assert kinds <= {"zeros", "lstm", "gru"}, kinds
        assert all(p.num_passes == 1 for p in ops)


def test_lstm_cell_stepped_in_python_loop_folds():
    history = log(CellLoop(), torch.rand(6, 2, 3))
    counts = passes_of(history)
    assert counts["lstmcell_1_4"] == 6 and counts["lstmcell_2_5"] == 6
    assert counts["getitem_1_3"] == 6
    assert history.modules["cell"].num_passes == 6


def test_module_passes_look_up_the_kth_call():
    model = SimpleRecurrent()
    history = log(model, torch.rand(6, 5))
    seen = []
    handle = model.fc.register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
    try:
        torch.manual_seed(0)
        model(history["input_1_0"].tensor_contents)
    finally:
        handle.remove()
    for k in range(1, 5):
        assert torch.equal(history[f"fc:{k}"].tensor_contents, seen[k - 1])
    assert history["fc:3"].label == "linear_1_1:3"
    assert history["fc"] is history.layer("linear_1_1")


def test_grouping_is_deterministic():
    labels = {tuple(log(ChangingBody(), torch.rand(3)).layer_labels) for _ in range(3)}
    assert len(labels) == 1


def test_summary_says_recurrent_and_most_passes():
    history = log(SimpleRecurrent(), torch.rand(6, 5))
    text = str(history)
    assert "recurrent (at most 4 passes)" in text
    assert "(pass 2 of 4)" in str(history["linear_1_1:2"])
    assert "purely feedforward" in str(log(nn.Linear(2, 2), torch.rand(1, 2)))


class LongLoop(nn.Module):
    def __init__(self, steps: int):
        super().__init__()
        self.steps = steps
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        for _ in range(self.steps):
            h = torch.tanh(self.fc(x))
            x = x + h * 0.5
            x = torch.sin(x) + torch.cos(x)
        return x


def test_long_loop_folds_every_step():
    """2,000+ ops; the grouping time itself is measured in bench/loops_bench.py."""
    history = log(LongLoop(300), torch.rand(2, 4), layers_to_save=None)
    assert len(history) > 2000
    counts = passes_of(history)
    assert counts["linear_1_1"] == 300
    assert sorted(set(counts.values())) == [1, 300]
