"""Tests of torchlog/selection.py: checking and resolving layers_to_save, and the two-pass save."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlog
from tests.invariants import check_history
from tests.models import Nested, SimpleRecurrent
from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError, NondeterministicModelError
from torchlog.history import ModelHistory
from torchlog.sites.entries import check_entries
from torchlog.sites.resolve import resolve

NESTED = ["input_1_0", "linear_1_1", "relu_1_2", "add_1_3", "layernorm_1_4", "linear_2_5", "relu_2_6",
          "add_2_7", "layernorm_2_8", "linear_3_9", "output_1_10"]


@pytest.fixture(scope="module")
def nested() -> ModelHistory:
    return torchlog.log_forward_pass(Nested(), torch.rand(2, 4), random_seed=0)


@pytest.fixture(scope="module")
def recurrent() -> ModelHistory:
    return torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5), random_seed=0)


# ----- check_entries ---------------------------------------------------------------------------
@pytest.mark.parametrize("given, entries", [
    ("all", None),
    (None, []),
    ("relu", ["relu"]),
    (-1, [-1]),
    (("relu", 3), ["relu", 3]),
    (["block1", "linear_1_1:2", 0], ["block1", "linear_1_1:2", 0]),
])
def test_check_entries_normalises_the_accepted_forms(given: object, entries: list | None) -> None:
    assert check_entries(given) == entries


def test_check_entries_returns_a_copy() -> None:
    given = ["relu"]
    entries = check_entries(given)
    entries.append("linear")
    assert given == ["relu"]


@pytest.mark.parametrize("given, error, shown", [
    (2.5, InvalidArgumentTypeError, "2.5"),
    (True, InvalidArgumentTypeError, "True"),
    ({"relu"}, InvalidArgumentTypeError, "{'relu'}"),
    ([], InvalidOptionError, "[]"),
    (["relu", None], InvalidArgumentTypeError, "None"),
    (["relu", False], InvalidArgumentTypeError, "False"),
    ([""], InvalidOptionError, "''"),
])
def test_check_entries_refuses_other_forms(given: object, error: type, shown: str) -> None:
    with pytest.raises(error) as caught:
        check_entries(given)
    assert shown in str(caught.value) and "'all', None, or a list" in str(caught.value)


# ----- resolve ---------------------------------------------------------------------------------
def _labels(history: ModelHistory, indexes: set[int]) -> list[str]:
    return [p.label for p in history if p.op_index in indexes]


@pytest.mark.parametrize("entries, labels", [
    (["relu_1_2"], ["relu_1_2"]),  # a label
    (["relu_1"], ["relu_1_2"]),  # a short label
    ([2, -1], ["relu_1_2", "output_1_10"]),  # positions, negative from the end
    (["block2.inner"], ["relu_2_6"]),  # a module: what its calls returned
    (["block1", "head"], ["layernorm_1_4", "linear_3_9"]),
    (["layernorm"], ["layernorm_1_4", "layernorm_2_8"]),  # a substring of labels
    (["relu_1_2", "relu", 2], ["relu_1_2", "relu_2_6"]),  # entries add up, each pass once
])
def test_resolve_each_entry_form(nested: ModelHistory, entries: list, labels: list[str]) -> None:
    assert _labels(nested, resolve(nested, entries)) == labels


def test_resolve_passes_of_a_recurrent_layer(recurrent: ModelHistory) -> None:
    assert _labels(recurrent, resolve(recurrent, ["linear_1_1"])) == [f"linear_1_1:{k}" for k in range(1, 5)]
    assert _labels(recurrent, resolve(recurrent, ["linear_1_1:3", "fc:1"])) == ["linear_1_1:1", "linear_1_1:3"]
    assert _labels(recurrent, resolve(recurrent, ["mul_1"])) == [f"mul_1_3:{k}" for k in range(1, 5)]


@pytest.mark.parametrize("entry, shown", [
    ("conv2d_1_1", "matches no layer, module or position"),
    ("layernorm_1_5", "closest: layernorm_1_4"),
    (len(NESTED), f"({len(NESTED)} layers)"),
    (-len(NESTED) - 1, "int positions (-5)"),
])
def test_resolve_names_what_matches_nothing(nested: ModelHistory, entry: object, shown: str) -> None:
    with pytest.raises(InvalidOptionError) as caught:
        resolve(nested, ["relu", entry])
    assert repr(entry) in str(caught.value) and shown in str(caught.value)


# ----- log_forward_pass(layers_to_save=...) ----------------------------------------------------
def test_only_the_chosen_passes_are_saved_and_kept() -> None:
    model, x = Nested(), torch.rand(2, 4)
    full = torchlog.log_forward_pass(model, x, random_seed=4)
    chosen = torchlog.log_forward_pass(model, x, random_seed=4, layers_to_save=["block1.inner", -2])
    check_history(chosen)
    assert chosen.layer_labels == ["relu_1_2", "linear_3_9"]  # exactly the chosen passes
    for record in chosen:
        assert torch.equal(record.tensor_contents, full[record.label].tensor_contents)
        assert chosen.lookup_keys(record.label)[2] == record.label


def test_keep_unsaved_layers_keeps_every_pass_without_its_tensor() -> None:
    history = torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5), layers_to_save=["add_1_2:2"],
                                        keep_unsaved_layers=True)
    check_history(history, complete=True)
    assert len(history) == 14
    assert [p.label for p in history if p.has_saved_tensor] == ["add_1_2:2"]


def test_none_saves_nothing_in_one_pass() -> None:
    calls = []
    model = SimpleRecurrent()
    model.register_forward_hook(lambda *args: calls.append(1))
    history = torchlog.log_forward_pass(model, torch.rand(2, 5), layers_to_save=None)
    assert calls == [1] and len(history) == 14 and history.num_saved == 0


class Noisy(nn.Module):
    """Adds fresh noise on each call and keeps every draw."""

    def __init__(self) -> None:
        super().__init__()
        self.draws: list[torch.Tensor] = []

    def forward(self, x):
        noise = torch.rand_like(x)
        self.draws.append(noise)
        return x + noise


def test_a_list_runs_the_model_once() -> None:
    """Entries no rule decides while the pass runs (a substring) save everything in that one
    pass, and the history keeps exactly what they name."""
    model = Noisy()
    history = torchlog.log_forward_pass(model, torch.zeros(3), layers_to_save=["add"])
    draws = model.draws
    assert len(draws) == 1
    assert history.layer_labels == ["add_1_2"]
    assert torch.equal(history["add_1_2"].tensor_contents, draws[0])


def test_a_streamed_list_runs_the_model_twice_with_one_seed(tmp_path) -> None:
    """With save_to, what is saved is written as the pass runs: a list no rule decides is
    resolved on a probe first, run with the same seed."""
    pytest.importorskip("h5py")
    model = Noisy()
    history = torchlog.log_forward_pass(model, torch.zeros(3), layers_to_save=["add"],
                                        save_to=str(tmp_path / "noisy.h5"))
    draws = model.draws
    assert len(draws) == 2 and torch.equal(draws[0], draws[1])
    assert torch.equal(history["add_1_2"].tensor_contents, draws[1])


class ChangesItsMind(nn.Module):
    """Runs a different op on each call: a Python counter the seed cannot reset."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return torch.relu(x) if self.calls % 2 else torch.sigmoid(x)


def test_a_model_that_runs_other_ops_the_second_time_raises(tmp_path) -> None:
    pytest.importorskip("h5py")
    assert torchlog.log_forward_pass(ChangesItsMind(), torch.ones(2), layers_to_save=["relu"]).layer_labels == [
        "relu_1_1"]  # one pass: nothing to disagree with
    with pytest.raises(NondeterministicModelError) as caught:
        torchlog.log_forward_pass(ChangesItsMind(), torch.ones(2), layers_to_save=["relu"], random_seed=9,
                                  save_to=str(tmp_path / "changes.h5"))
    assert isinstance(caught.value, RuntimeError)
    text = str(caught.value)
    assert "ChangesItsMind ran different ops on two passes with random seed 9" in text
    assert "layers_to_save='all'" in text


def test_the_same_model_logs_with_a_single_pass() -> None:
    model = ChangesItsMind()
    assert torchlog.log_forward_pass(model, torch.ones(2)).layer_labels[1] == "relu_1_1"
    assert torchlog.log_forward_pass(model, torch.ones(2), layers_to_save=None).layer_labels[1] == "sigmoid_1_1"


# ----- the model's outputs stay named, and are saved when chosen -------------------------------
class TwoHeads(nn.Module):
    """Returns a dict of two outputs made by different ops."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.left, self.right = nn.Linear(4, 4), nn.Linear(4, 2), nn.Linear(4, 3)

    def forward(self, x):
        h = torch.relu(self.body(x))
        return {"left": self.left(h), "right": torch.sigmoid(self.right(h))}


def test_outputs_are_listed_and_saved_only_when_chosen() -> None:
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), torch.rand(2, 4)
    history = torchlog.log_forward_pass(model, x, layers_to_save=["relu"])
    check_history(history)
    assert history.layer_labels == ["relu_1_2"] and history.output_layers == []
    chosen = torchlog.log_forward_pass(model, x, layers_to_save=["relu", "output"])
    assert chosen.layer_labels == ["relu_1_2", "output_1_4"]
    (output,) = chosen.output_layers
    assert torch.equal(chosen[output].tensor_contents, model(x).detach())
    assert torch.equal(history["relu_1_2"].tensor_contents, torch.relu(model[0](x)).detach())


@pytest.mark.parametrize("entries", [["relu"], ["left"], [-1], ["sigmoid", "output"]])
def test_output_layers_lists_the_outputs_chosen(entries: list) -> None:
    torch.manual_seed(0)
    model, x = TwoHeads(), torch.rand(2, 4)
    full = torchlog.log_forward_pass(model, x, random_seed=0)
    chosen = torchlog.log_forward_pass(model, x, random_seed=0, layers_to_save=entries)
    check_history(chosen)
    assert chosen.output_layers == [label for label in full.output_layers if label in chosen.layer_labels]
    assert len(full.output_layers) == 2
    assert len(set(chosen.layer_labels)) == len(chosen.layer_labels)
    wanted = resolve(full, entries)
    assert chosen.layer_labels == [p.label for p in full if p.op_index in wanted]
    for record in chosen:
        assert torch.equal(record.tensor_contents, full[record.label].tensor_contents)


def test_a_model_that_raises_keeps_what_ran_and_has_no_outputs() -> None:
    class Fails(nn.Module):
        def forward(self, x):
            y = torch.relu(x)
            raise ValueError("stop")

    history = torchlog.log_forward_pass(Fails(), torch.ones(2), layers_to_save=["relu"], on_error="return")
    assert history.layer_labels == ["relu_1_1"] and history.output_layers == []
