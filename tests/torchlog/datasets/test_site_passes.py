"""Tests of torchlog/datasets/site_passes.py through the Driver with every_output (extract's
capture): each site's passes found on the first batch's logged pass, then found again in each
batch by module hooks, call positions or places, the model's inputs, or a logged pass."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import torchlog
from tests.models import (
    TINY_MODELS,
    IdentityModules,
    ModuleOutputs,
    MutatedThroughView,
    Nested,
    ReusedModule,
    WithBuffers,
)
from torchlog.capture import run_lean
from torchlog.errors import InvalidOptionError, OpSequenceChangedWarning
from torchlog.history import all_passes
from torchlog.model_state import model_kept
from torchlog.seeding import seeded
from torchlog.sites.resolve import resolve
from torchlog.datasets.driver import Driver, DriverOptions
from torchlog.datasets.site_passes import select


def _full(model: nn.Module, batch: torch.Tensor, entries: list, seed: int) -> dict:
    """The oracle: the selected passes' values on the full logged path."""
    with torch.no_grad():
        history = torchlog.log_forward_pass(model, batch, layers_to_save=entries, random_seed=seed,
                                            keep_unsaved_layers=True)
    chosen = resolve(history, entries)
    return {p.label: p.tensor_contents for p in history if p.op_index in chosen}


def _driver(model: nn.Module, entries: list, **options) -> Driver:
    return Driver(model, entries, options=DriverOptions(every_output=True, **options))


def _check_batches(model: nn.Module, entries: list, batches: list, kind: str) -> None:
    driver = _driver(model, entries, seed=10)
    for index, batch in enumerate(batches):
        values = driver.by_label(batch, index)
        assert driver.kind == kind
        expected = _full(model, batch, entries, 10 + index)
        assert list(values) == list(expected)  # the same labels, in execution order
        for label, value in expected.items():
            assert torch.equal(values[label], value), label


@pytest.mark.parametrize("make_model, shape, entries, kind", [
    (Nested, (2, 4), ["block1", "block2.inner"], "hooks"),
    (ReusedModule, (2, 4), ["cell", "act"], "hooks"),
    (IdentityModules, (2, 3), ["ident", "through"], "hooks"),
    (ModuleOutputs, (2, 3), ["reversed", "param", "twice", "as_dict", "lin", "mutates"], "hooks"),
    (MutatedThroughView, (2, 4), ["scatter"], "hooks"),
    (ModuleOutputs, (2, 3), ["exp", "relu_", 0, -1, "mul"], "lean"),
    (Nested, (2, 4), ["linear", "block1.inner"], "lean"),
    (ReusedModule, (2, 4), ["linear_1_1:2", "tanh"], "lean"),
    (lambda: nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval(), (2, 3, 8),
     ["scaleddotproductattention", "transpose_6", "layernorm"], "lean"),  # inside functionals
])
def test_each_batch_gives_what_the_full_logged_path_saves(make_model, shape, entries, kind) -> None:
    torch.manual_seed(0)
    model = make_model()
    batches = [torch.randn(*shape) for _ in range(3)]
    _check_batches(model, entries, batches, kind)


def test_a_buffer_logs_each_batch_once() -> None:
    model, calls = WithBuffers(), []
    model.register_forward_pre_hook(lambda m, args: calls.append(1))
    driver = _driver(model, ["buffer"])
    for index in range(3):
        driver.by_label(torch.randn(2, 4), index)
    assert driver.kind == "logged" and len(calls) == 3


class Flip(nn.Module):
    """sin on odd calls, cos on even ones; counts its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x.sin() if self.calls % 2 else x.cos()


@pytest.mark.parametrize("changed_ops, message", [
    ("error", r"batch 1 ran other ops than the first batch before a chosen site: after 0 equal calls it ran "
              r"'cos' where the first batch ran 'sin'.*changed_ops='by_place'"),
    ("by_place", r"site 'sin' gave no value in batch 1: 'sin_1_1' \(its op call on the first batch\) did not run"),
])
def test_the_first_batch_is_one_call_and_a_batch_without_a_chosen_op_is_refused(changed_ops, message) -> None:
    model = Flip()
    driver = _driver(model, ["sin"], changed_ops=changed_ops)
    values = driver.by_label(torch.ones(2), 0)
    assert model.calls == 1 and driver.kind == "lean"
    torch.testing.assert_close(values["sin_1_1"], torch.ones(2).sin())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OpSequenceChangedWarning)
        with pytest.raises(InvalidOptionError, match=message):
            driver.by_label(torch.ones(2), 1)
    assert model.calls == 2


class Branchy(nn.Module):
    """Runs one more op, or one more module, before fc1 for a batch whose first value is above 50."""

    def __init__(self, extra_module: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.extra = nn.Linear(3, 4), nn.Linear(4, 2), nn.Tanh()
        self.extra_module = extra_module

    def forward(self, x):
        if x[0, 0] > 50:
            x = self.extra(x) if self.extra_module else x.sin()
        return self.fc2(torch.relu(self.fc1(x)))


def _marked(index: int) -> list[torch.Tensor]:
    batches = [torch.randn(3, 3) for _ in range(4)]
    batches[index][0, 0] = 100.0
    return batches


def test_module_sites_are_found_by_hooks_whatever_runs_around_them() -> None:
    model, batches = Branchy(extra_module=True), _marked(2)
    driver = _driver(model, ["fc1", "fc2"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        saved = [driver.by_label(batch, i) for i, batch in enumerate(batches)]
    # extra runs two ops first: fc1 gives linear_1_3 in batch 0, linear_1_4 in batch 2.
    assert driver.kind == "hooks" and list(saved[2]) == ["linear_1_3", "linear_2_5"]
    with torch.no_grad():
        expected = model.fc1(model.extra(batches[2]))
    assert torch.equal(saved[2]["linear_1_3"], expected)  # fc1's output, under batch 0's label


def test_a_module_called_another_number_of_times_is_refused_unless_by_place() -> None:
    class Repeat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.act = nn.Tanh()

        def forward(self, x):
            for _ in range(3 if x[0, 0] > 50 else 2):
                x = self.act(x)
            return x

    batches = _marked(1)
    driver = _driver(Repeat(), ["act"])
    driver.by_label(batches[0], 0)
    with pytest.raises(InvalidOptionError, match=r"site 'act': module 'act' was called 3 time\(s\) in batch 1, "
                                                 r"2 time\(s\) in the first batch.*\('act:1'\)"):
        driver.by_label(batches[1], 1)
    driver = _driver(Repeat(), ["act"], changed_ops="by_place")
    with pytest.warns(OpSequenceChangedWarning, match="saved its first 2 call"):
        saved = [driver.by_label(b, i) for i, b in enumerate(batches)]
    assert list(saved[1]) == list(saved[0]) and torch.equal(saved[1][list(saved[1])[1]], batches[1].tanh().tanh())


def test_random_ops_follow_the_seed_of_each_batch() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5)).train()
    batch = torch.ones(4, 3)
    first = _driver(model, ["dropout"], seed=7).by_label(batch, 0)["dropout_1_2"]
    again = _driver(model, ["dropout"], seed=0)
    again.by_label(batch, 0)
    assert torch.equal(again.by_label(batch, 7)["dropout_1_2"], first)
    assert not torch.equal(again.by_label(batch, 8)["dropout_1_2"], first)


class BatchSizeDependent(nn.Module):
    """Runs one more op on batches of more than one sample, and cannot run one sample in training."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.norm = nn.Linear(3, 3), nn.BatchNorm1d(3)

    def forward(self, x):
        if x.shape[0] > 1:
            x = x * 2
        return self.norm(self.fc(x)).relu()


@pytest.mark.parametrize("train", [False, True])
def test_a_model_that_differs_on_one_sample_is_probed_on_the_whole_batch(train: bool) -> None:
    model = BatchSizeDependent().train(train)
    batches = [torch.randn(4, 3) for _ in range(2)]
    _check_batches(model, ["linear", "relu"], batches, "lean")


@pytest.mark.parametrize("name", sorted(TINY_MODELS) + ["module_outputs"])
def test_places_pick_the_ops_that_call_positions_pick(name: str) -> None:
    """On a batch that runs the first batch's ops, every op found at its place (function,
    innermost module, count) is the op at its call position: the lean pass attributes ops to
    modules as the logged pass does, on every hard case of tests/models.py."""
    make_model, make_input = {**TINY_MODELS, "module_outputs": (ModuleOutputs, lambda: torch.randn(2, 3))}[name]
    torch.manual_seed(0)
    model, x = make_model(), make_input()
    named = list(model.named_modules())
    with torch.no_grad():
        history = torchlog.log_forward_pass(model, x, layers_to_save="all", random_seed=0)
        selection = select(history, [p.label for p in all_passes(history)], {}, [], True)
        ops = [c for chosen in selection.per_site.values() for c in chosen if c.how == "op"]
        with seeded(0), model_kept(named):
            seen = run_lean(model, (x,), {}, selection.wanted, selection.places, named)
    assert ops and len(seen.saved) == len({c.key for c in ops})
    for chosen in ops:
        by_call, by_place = seen.saved[chosen.key], seen.at_places[chosen.place]
        assert by_place is by_call or torch.equal(by_place, by_call), chosen.label
