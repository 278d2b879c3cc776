"""extract calls the model once per batch: the first batch's values come from its own logged
pass, and a batch that runs other ops is saved from that same call, at the first batch's places."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import torchlog
from tests.models import TINY_MODELS, ModuleOutputs
from torchlog.history import all_passes
from torchlog.model_state import model_kept
from torchlog.seeding import seeded
from torchlog.errors import OpSequenceChangedWarning
from torchlog.datasets.extract_plan import ExtractPlan, _lean_kind, _lean_runner

NUM_BATCHES, BATCH = 5, 4


class CountingNet(nn.Module):
    """fc1 -> scaled by its call count -> act -> fc2; two more ops on a batch whose first value
    is above 50. Its values depend on how often it was called, so a run that calls it more
    often than once per batch saves other values than a plain loop."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.act, self.fc2 = nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        h = self.fc1(x) * self.calls
        if bool(x[0, 0] > 50):  # a data-dependent branch
            h = h.sin().abs()
        return self.fc2(self.act(h))


def _batches(marked: int | None) -> list[torch.Tensor]:
    batches = list(torch.randn(NUM_BATCHES * BATCH, 6, generator=torch.Generator().manual_seed(1)).split(BATCH))
    if marked is not None:
        batches[marked][0, 0] = 100.0
    return batches


def _plain_loop(batches: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The oracle: a fresh model over the batches in a no_grad loop, forward hooks copying."""
    model = CountingNet()
    rows: dict[str, list[torch.Tensor]] = {"fc1": [], "act": [], "fc2": [], "mul": []}
    for name in ("fc1", "act", "fc2"):
        getattr(model, name).register_forward_hook(lambda m, i, out, name=name: rows[name].append(out.clone()))
    with torch.no_grad():
        for batch in batches:
            model(batch)
            rows["mul"].append(rows["fc1"][-1] * model.calls)
    return {name: torch.cat(values) for name, values in rows.items()}


# Entries and the oracle row each saved label holds: module addresses (forward hooks), and
# labels and substrings (the lean capture).
CASES = {
    "modules": (["fc1", "act", "fc2"], {"linear_1_1": "fc1", "relu_1_5": "act", "linear_2_6": "fc2"}),
    "labels": (["linear", "mul_1_2", "relu"], {"linear_1_1": "fc1", "mul_1_2": "mul", "relu_1_5": "act",
                                                "linear_2_6": "fc2"}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_five_batches_are_five_calls_and_the_plain_loops_rows(tmp_path: Path, case: str) -> None:
    entries, oracle_of = CASES[case]
    model, batches = CountingNet(), _batches(marked=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every batch runs the first batch's ops
        acts = torchlog.extract(model, batches, entries, tmp_path / "acts.h5", progress=False)
    assert model.calls == NUM_BATCHES
    expected = _plain_loop(batches)
    assert list(acts) == list(oracle_of)
    for label, name in oracle_of.items():
        torch.testing.assert_close(acts.tensor(label), expected[name], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_batch_running_other_ops_is_still_one_call_with_the_plain_loops_rows(tmp_path: Path, case: str) -> None:
    entries, oracle_of = CASES[case]
    model, batches = CountingNet(), _batches(marked=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        acts = torchlog.extract(model, batches, entries, tmp_path / "acts.h5", progress=False)
    changed = [str(w.message) for w in caught if issubclass(w.category, OpSequenceChangedWarning)]
    if case == "labels":  # module hooks see the same module calls: only the lean pass notices
        assert len(changed) == 1 and changed[0].startswith("batch 2 ran other ops than the first batch "
                                                           "(call 5 is 'sin' where the first batch had 'relu'")
    else:
        assert changed == []
    assert model.calls == NUM_BATCHES
    expected = _plain_loop(batches)
    for label, name in oracle_of.items():
        torch.testing.assert_close(acts.tensor(label), expected[name], rtol=1e-6, atol=1e-6)


def test_a_selection_the_lean_pass_cannot_find_logs_each_batch_once() -> None:
    from tests.models import WithBuffers

    model, calls = WithBuffers(), []
    model.register_forward_pre_hook(lambda m, args: calls.append(1))
    plan = ExtractPlan(model, ["buffer"])
    for index in range(3):
        plan.save(torch.randn(2, 4), index, index)
    assert plan.kind == "full" and len(calls) == 3


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
        ops = [p for p in all_passes(history) if _lean_kind(p) == "op"]
        runner, _ = _lean_runner(all_passes(history), ops, [p.label for p in ops], named)
        with seeded(0), model_kept(named):
            seen = runner.run(model, (x,), {})
    assert list(seen.by_place) == list(seen.by_call) == [p.label for p in ops]
    for label, value in seen.by_call.items():
        assert seen.by_place[label] is value or torch.equal(seen.by_place[label], value), label
