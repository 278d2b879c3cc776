"""Tests of torchlog/intervened.py: torchlog.run, a model's output under interventions with no log."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlog
from tests.models import SimpleRecurrent
from tests.state_snapshot import differences, take
from torchlog import select
from torchlog.errors import InterventionError
from torchlog.interventions import replace_with, scale, zero_ablate
from torchlog.sites.probes import PROBES


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)), torch.rand(5, 3)


@pytest.mark.parametrize("site", ["1", "relu_1_2", select.func("relu"), 2],
                         ids=["module", "label", "selector", "position"])
def test_run_gives_the_logged_intervened_output(site) -> None:
    model, x = _net()
    logged = torchlog.log_forward_pass(model, x, intervene={site: scale(-1.0)})
    result = torchlog.run(model, x, intervene={site: scale(-1.0)})
    torch.testing.assert_close(result.output, logged[-1].tensor_contents, rtol=0, atol=0)
    assert len(result.interventions) == len(logged.interventions) == 1
    assert result.interventions[0].max_abs_change == pytest.approx(logged.interventions[0].max_abs_change)


def test_a_plan_field_the_lean_run_cannot_honour_is_refused_naming_it() -> None:
    model, x = _net()
    with pytest.raises(InterventionError, match=r"at_exits: site .* has an op condition"):
        torchlog.run(model, x, intervene={select.module("0") & select.func("linear"): scale(-1.0)})
    with pytest.raises(InterventionError, match=r"at_ops: site .* may read the op's position"):
        torchlog.run(model, x, intervene={select.where(lambda op: op.op_index == 2): scale(-1.0)})


def test_run_on_the_recurrent_seed_model_acts_on_every_pass_of_a_loop_label() -> None:
    torch.manual_seed(0)
    model, x = SimpleRecurrent(), torch.rand(2, 5)
    logged = torchlog.log_forward_pass(model, x, intervene={"add_1_2": scale(0.5)})
    result = torchlog.run(model, x, intervene={"add_1_2": scale(0.5)})
    torch.testing.assert_close(result.output, logged[-1].tensor_contents, rtol=0, atol=0)
    assert [r.label for r in result.interventions] == [r.label for r in logged.interventions]


def test_an_out_argument_op_is_edited_where_the_model_reads_it() -> None:
    class WritesOut(nn.Module):
        def forward(self, x):
            c = torch.empty(3)
            torch.add(x, 1, out=c)
            return c * 2

    x = torch.ones(3)
    logged = torchlog.log_forward_pass(WritesOut(), x, intervene={"add_1_2": replace_with(torch.full((3,), 7.0))})
    result = torchlog.run(WritesOut(), x, intervene={"add_1_2": replace_with(torch.full((3,), 7.0))})
    assert torch.equal(logged[-1].tensor_contents, torch.full((3,), 14.0))
    assert torch.equal(result.output, torch.full((3,), 14.0))


def test_a_site_that_acts_nowhere_is_an_error() -> None:
    model, x = _net()
    with pytest.raises(InterventionError, match=r"matched no op of this run"):
        torchlog.run(model, x, intervene={select.func("sigmoid"): zero_ablate()})
    with pytest.raises(InterventionError, match=r"matches no pass"):
        torchlog.run(model, x, intervene={"sigmoid_1_2": zero_ablate()})
    with pytest.raises(torchlog.InvalidOptionError, match=r"needs intervene= or stop_after="):
        torchlog.run(model, x)


def test_stop_after_ends_the_run_and_the_model_is_left_as_it_was() -> None:
    model, x = _net()
    before = take(model)
    ran = []
    handle = model[2].register_forward_pre_hook(lambda m, a: ran.append("2"))
    try:
        result = torchlog.run(model, x, intervene={"0": scale(2.0)}, stop_after="1")
    finally:
        handle.remove()
    assert result.stopped and result.output is None and ran == []
    assert differences(before, take(model)) == []


def test_a_label_site_probes_once_per_input_signature() -> None:
    model, x = _net()
    PROBES.drop_model(model)
    calls = []
    handle = model.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        torchlog.run(model, x, intervene={"relu_1_2": zero_ablate()})
        first = len(calls)
        torchlog.run(model, x, intervene={"relu_1_2": zero_ablate()})
    finally:
        handle.remove()
    assert first == 2 and len(calls) == 3  # a probe, then one lean pass per call
