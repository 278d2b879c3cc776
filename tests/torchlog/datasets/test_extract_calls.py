"""extract calls the model once per batch: the first batch's values come from its own logged
pass; a batch that runs other ops before a chosen op is refused, or with changed_ops='by_place'
saved from that same call, at the first batch's places."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import torchlog
from torchlog.errors import InvalidOptionError, OpSequenceChangedWarning

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
def test_a_batch_running_other_ops_by_place_is_still_one_call_with_the_plain_loops_rows(tmp_path: Path,
                                                                                       case: str) -> None:
    entries, oracle_of = CASES[case]
    model, batches = CountingNet(), _batches(marked=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        acts = torchlog.extract(model, batches, entries, tmp_path / "acts.h5", progress=False,
                                changed_ops="by_place")
    changed = [str(w.message) for w in caught if issubclass(w.category, OpSequenceChangedWarning)]
    if case == "labels":  # module hooks find the same module calls: only the lean pass notices
        assert len(changed) == 1 and changed[0].startswith("batch 2 ran other ops than the first batch before a "
                                                           "chosen site: after 4 equal calls it ran 'sin' where "
                                                           "the first batch ran 'relu'")
    else:
        assert changed == []
    assert model.calls == NUM_BATCHES
    expected = _plain_loop(batches)
    for label, name in oracle_of.items():
        torch.testing.assert_close(acts.tensor(label), expected[name], rtol=1e-6, atol=1e-6)


def test_a_batch_running_other_ops_before_a_chosen_op_is_refused_by_default(tmp_path: Path) -> None:
    entries, _ = CASES["labels"]
    model, batches = CountingNet(), _batches(marked=2)
    with pytest.raises(InvalidOptionError, match=r"batch 2 ran other ops than the first batch before a chosen "
                                                 r"site: after 4 equal calls it ran 'sin' where the first batch "
                                                 r"ran 'relu'.*changed_ops='by_place'"):
        torchlog.extract(model, batches, entries, tmp_path / "acts.h5", progress=False)
    assert model.calls == 3  # batches 0 and 1 written, batch 2 refused before it was


def test_a_bad_changed_ops_is_refused_before_the_model_runs(tmp_path: Path) -> None:
    model = CountingNet()
    with pytest.raises(InvalidOptionError, match=r"changed_ops must be 'error' .* or 'by_place', got 'place'"):
        torchlog.extract(model, _batches(None), ["fc1"], tmp_path / "acts.h5", changed_ops="place")
    assert model.calls == 0 and not (tmp_path / "acts.h5").exists()
