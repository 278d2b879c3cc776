"""Tests of torchlog/datasets/extract_plan.py and extract_runners.py: the selection resolved on the first
batch's logged pass, then module hooks or a lean pass per batch, and a batch whose ops changed
saved from its own call at the first batch's places."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchlog
from tests.models import (
    IdentityModules,
    ModuleOutputs,
    MutatedThroughView,
    Nested,
    ReusedModule,
    WithBuffers,
)
from torchlog.errors import LogFileError, OpSequenceChangedWarning
from torchlog.sites.resolve import resolve
from torchlog.datasets.extract_plan import ExtractPlan


def _full(model: nn.Module, batch: torch.Tensor, entries: list, seed: int) -> dict:
    """The selected passes' values on the full logged path (which also keeps every output)."""
    with torch.no_grad():
        history = torchlog.log_forward_pass(model, batch, layers_to_save=entries, random_seed=seed,
                                            keep_unsaved_layers=True)
    chosen = resolve(history, entries)
    return {p.label: p.tensor_contents for p in history if p.op_index in chosen}


def _check_batches(model: nn.Module, entries: list, batches: list, kind: str) -> None:
    plan = ExtractPlan(model, entries)
    for index, batch in enumerate(batches):
        values, history = plan.save(batch, 10 + index, index)
        assert plan.kind == kind and history is None
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
def test_each_batch_saves_what_the_full_logged_path_saves(make_model, shape, entries, kind) -> None:
    torch.manual_seed(0)
    model = make_model()
    batches = [torch.randn(*shape) for _ in range(3)]
    _check_batches(model, entries, batches, kind)


def test_buffers_and_callbacks_take_the_full_path() -> None:
    model = WithBuffers()
    batch = torch.randn(2, 4)
    plan = ExtractPlan(model, ["buffer"])
    plan.save(batch, 0, 0)
    assert plan.kind == "full"
    plan = ExtractPlan(nn.Sequential(nn.Linear(2, 2)), ["0"], needs_history=True)
    values, history = plan.save(torch.ones(3, 2), 0, 0)
    assert plan.kind == "full" and history is not None and list(values) == ["linear_1_1"]


class Branchy(nn.Module):
    """Runs one more op, or one more module, for a batch whose first value is above 50."""

    def __init__(self, extra_module: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.extra = nn.Linear(3, 4), nn.Linear(4, 2), nn.Tanh()
        self.extra_module = extra_module

    def forward(self, x):
        if x[0, 0] > 50:
            x = self.extra(x) if self.extra_module else x.sin()
        return self.fc2(torch.relu(self.fc1(x)))


def _data(marked: int) -> list[torch.Tensor]:
    batches = [torch.randn(3, 3) for _ in range(4)]
    batches[marked][0, 0] = 100.0
    return batches


def test_a_batch_calling_another_module_is_saved_from_its_own_call() -> None:
    model, batches = Branchy(extra_module=True), _data(marked=2)
    plan = ExtractPlan(model, ["fc1", "fc2"])
    with pytest.warns(OpSequenceChangedWarning, match=r"batch 2 ran other modules than the first "
                      r"batch \(module call 2 is 'extra' where the first batch had 'fc1'"):
        saved = [plan.save(batch, i, i)[0] for i, batch in enumerate(batches)]
    # x[0, 0] > 50 runs two ops first: fc1 gives linear_1_3 in batch 0, linear_1_4 in batch 2.
    assert plan.num_changed == 1 and list(saved[2]) == ["linear_1_3", "linear_2_5"]
    with torch.no_grad():
        expected = model.fc1(model.extra(batches[2]))
    assert torch.equal(saved[2]["linear_1_3"], expected)  # fc1's output, under batch 0's label


def test_a_batch_running_other_ops_is_saved_from_its_own_call_at_the_same_places(tmp_path: Path) -> None:
    model, batches = Branchy(extra_module=False), _data(marked=1)
    with pytest.warns(OpSequenceChangedWarning, match=r"batch 1 ran other ops than the first batch "
                      r"\(call 3 is 'sin' where the first batch had 'linear'.*each chosen op was saved "
                      r"from this same call at its place on the first batch"):
        acts = torchlog.extract(model, batches, ["linear_2", "relu"], tmp_path / "a.h5")
    assert list(acts) == ["relu_1_4", "linear_2_5"]  # the first batch's labels
    with torch.no_grad():  # the oracle: the plain computation, the branch included
        hidden = [torch.relu(model.fc1(b.sin() if b[0, 0] > 50 else b)) for b in batches]
        expected = torch.cat([model.fc2(h) for h in hidden])
    np.testing.assert_allclose(acts["linear_2_5"], expected.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(acts["relu_1_4"], torch.cat(hidden).numpy(), rtol=1e-6, atol=1e-7)
    with warnings.catch_warnings():  # a module's output does not depend on ops around it
        warnings.simplefilter("error")
        acts = torchlog.extract(model, batches, ["fc2"], tmp_path / "b.h5")
    np.testing.assert_array_equal(acts["linear_2_5"], expected.numpy())


def test_a_chosen_op_that_a_batch_does_not_run_is_refused(tmp_path: Path) -> None:
    model, batches = Branchy(extra_module=False), _data(marked=0)  # only batch 0 runs sin
    with pytest.warns(OpSequenceChangedWarning, match="batch 1 ran other ops.*; not run in this batch: sin_1_3"):
        with pytest.raises(LogFileError, match=r"batch 1 saved layers \['linear_2_6'\] but earlier "
                           r"batches saved \['linear_2_6', 'sin_1_3'\]"):
            torchlog.extract(model, batches, ["sin", "linear_2"], tmp_path / "a.h5")


def test_a_model_whose_ops_change_on_every_call_is_logged_once_and_reported() -> None:
    class Flip(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return x.sin() if self.calls % 2 else x.cos()

    model = Flip()
    plan = ExtractPlan(model, ["sin"])
    values, _ = plan.save(torch.ones(2), 0, 0)
    assert model.calls == 1 and plan.kind == "lean"
    torch.testing.assert_close(values["sin_1_1"], torch.ones(2).sin())
    with pytest.warns(OpSequenceChangedWarning, match="call 1 is 'cos' where the first batch had 'sin'"):
        values, _ = plan.save(torch.ones(2), 1, 1)
    assert model.calls == 2 and values == {} and plan.num_changed == 1


def test_random_ops_follow_the_seed_of_each_batch() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5)).train()
    batch = torch.ones(4, 3)
    first = ExtractPlan(model, ["dropout"]).save(batch, 7, 0)[0]["dropout_1_2"]
    again = ExtractPlan(model, ["dropout"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again.save(batch, 0, 0)
        assert torch.equal(again.save(batch, 7, 1)[0]["dropout_1_2"], first)


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
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _check_batches(model, ["linear", "relu"], batches, "lean")
