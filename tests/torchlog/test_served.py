"""Tests of torchlog/served.py: a layers_to_save list served by the lean capture from a kept probe."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlog
import torchlog.api as api
from tests.invariants import check_history
from torchlog.history import all_passes
from torchlog.sites.probes import PROBES


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        for _ in range(2):
            h = torch.tanh(h) * 2
        return self.fc2(h)


@pytest.fixture
def served_calls(monkeypatch):
    calls = []
    original = api.served_history

    def counted(*args):
        found = original(*args)
        calls.append(found is not None)
        return found

    monkeypatch.setattr(api, "served_history", counted)
    return calls


def _hooked(model, x):
    seen = {}
    handles = [model.fc1.register_forward_hook(lambda m, a, out: seen.setdefault("fc1", out.detach().clone())),
               model.fc2.register_forward_hook(lambda m, a, out: seen.setdefault("fc2", out.detach().clone()))]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    return seen


@pytest.mark.parametrize("entries", [["fc1", "fc2"], ["tanh", "fc2"], ["mul_1_4:2", 1]])
def test_the_second_call_is_served_and_equals_the_logged_pass(entries, served_calls) -> None:
    torch.manual_seed(0)
    model, x = Net(), torch.rand(3, 4)
    PROBES.drop_model(model)
    with torch.no_grad():
        first = torchlog.log_forward_pass(model, x, layers_to_save=entries)
        second = torchlog.log_forward_pass(model, x, layers_to_save=entries)
    assert served_calls == [True]
    check_history(second)
    assert second.layer_labels == first.layer_labels
    for label in first.layer_labels:
        assert torch.equal(second[label].tensor_contents, first[label].tensor_contents), label
    if entries[0] == "fc1":
        seen = _hooked(model, x)
        assert torch.equal(second[second.layer_labels[0]].tensor_contents, seen["fc1"])
        assert torch.equal(second[second.layer_labels[-1]].tensor_contents, seen["fc2"])
    # The first history is untouched, and the kept probe keeps no values.
    from torchlog.sites.probes import signature
    probe = PROBES.get(model, signature(model, list(model.named_modules()), (x,), {}))
    assert probe is not None and all(p.saved is None for p in all_passes(probe))


def test_new_values_do_not_reach_earlier_histories(served_calls) -> None:
    torch.manual_seed(0)
    model = Net()
    PROBES.drop_model(model)
    with torch.no_grad():
        torchlog.log_forward_pass(model, torch.rand(3, 4), layers_to_save=["fc2"])
        a = torchlog.log_forward_pass(model, torch.ones(3, 4), layers_to_save=["fc2"])
        b = torchlog.log_forward_pass(model, torch.zeros(3, 4), layers_to_save=["fc2"])
    assert served_calls == [True, True]
    label = a.layer_labels[0]
    assert torch.equal(a[label].tensor_contents, model(torch.ones(3, 4)).detach())
    assert torch.equal(b[label].tensor_contents, model(torch.zeros(3, 4)).detach())


def test_keep_unsaved_layers_and_a_model_that_changes_its_ops_are_served_right(served_calls) -> None:
    class Switch(Net):
        def __init__(self) -> None:
            super().__init__()
            self.deep = False

        def forward(self, x):
            out = super().forward(x)
            return torch.sigmoid(out) if self.deep else out

    torch.manual_seed(0)
    model, x = Switch(), torch.rand(3, 4)
    PROBES.drop_model(model)
    with torch.no_grad():
        torchlog.log_forward_pass(model, x, layers_to_save=["fc1"])
        kept = torchlog.log_forward_pass(model, x, layers_to_save=["fc1"], keep_unsaved_layers=True)
        assert len(kept) == len(all_passes(kept)) and kept.num_saved == 1
        model.deep = True  # same input signature, one more op: the served pass is refused
        changed = torchlog.log_forward_pass(model, x, layers_to_save=["fc1", "sigmoid"])
    assert served_calls == [True, False]
    check_history(changed)
    assert [p.func_name for p in changed] == ["linear", "sigmoid"]


def test_values_that_need_their_graph_are_logged_in_full(served_calls) -> None:
    torch.manual_seed(0)
    model, x = Net(), torch.rand(3, 4)
    PROBES.drop_model(model)
    torchlog.log_forward_pass(model, x, layers_to_save=["fc2"])
    history = torchlog.log_forward_pass(model, x, layers_to_save=["fc2"])  # grad mode on
    assert served_calls == []
    assert history[history.layer_labels[0]].tensor_contents.grad_fn is not None


def test_a_model_whose_ops_change_at_every_call_stops_being_served_after_two_misses(served_calls) -> None:
    """Each miss costs a lean pass and the full one; after two in a row the signature is
    logged in full at once, so the model runs once per call again (counted by a pre-hook)."""
    class Alternating(Net):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            out = super().forward(x)
            return torch.sigmoid(out) if self.calls % 2 else torch.exp(out)

    torch.manual_seed(0)
    model, x = Alternating(), torch.rand(3, 4)
    PROBES.drop_model(model)
    runs = []
    handle = model.register_forward_pre_hook(lambda module, args: runs.append(1))
    try:
        with torch.no_grad():
            histories = []
            for _ in range(5):
                runs.clear()
                history = torchlog.log_forward_pass(model, x, layers_to_save=["fc2"])
                histories.append((history, len(runs), model.calls))
    finally:
        handle.remove()
    assert served_calls == [False, False]
    assert [count for _, count, _ in histories] == [1, 2, 2, 1, 1]
    for history, _, calls in histories:  # each history is of the call's last run (a full pass)
        last = {p.func_name for p in all_passes(history)} & {"exp", "sigmoid"}
        assert last == {"sigmoid" if calls % 2 else "exp"}, calls
    # A match starts the count again: the model that changed once is served as before.
    model.calls = 0
    PROBES.drop_model(model)
    model.forward = lambda x: Net.forward(model, x)  # the same ops at every call from now on
    with torch.no_grad():
        for _ in range(4):
            torchlog.log_forward_pass(model, x, layers_to_save=["fc2"])
    vars(model).pop("forward")
    assert served_calls == [False, False, True, True, True]


def test_tensors_inside_an_argument_object_are_part_of_the_signature(served_calls) -> None:
    """A KV cache object's tensors decide the shapes of the ops that read it: a call with a
    longer cache is not served from the probe of a shorter one (its shapes would be stale)."""
    class Cache:
        def __init__(self, length: int) -> None:
            self.layers = [{"keys": torch.ones(1, length, 4)}]

    class Reader(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x, cache):
            return self.fc(torch.cat([cache.layers[0]["keys"], x], dim=1)).sum(dim=1)

    torch.manual_seed(0)
    model, x = Reader(), torch.rand(1, 1, 4)
    PROBES.drop_model(model)
    with torch.no_grad():
        histories = [torchlog.log_forward_pass(model, [x, Cache(n)], layers_to_save=["fc"]) for n in (2, 3, 3)]
    assert served_calls == [True]  # only the third call, whose cache is as long as the second's
    for history, length in zip(histories, (3, 4, 4)):
        check_history(history)
        assert history[history.layer_labels[0]].tensor_contents.shape == (1, length, 4)
