"""Tests of counterfactual replay (torchlog/replay/counterfactual.py).

The oracle is the model itself: an intervened rerun (`log_forward_pass(intervene=...)`), which
replay must equal bit for bit, pass by pass, on models whose ops do not depend on the values
the intervention changes; on the seed's recurrent model also the edit computed with plain torch.
"""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import torchlog
from tests.invariants import check_history
from tests.models import SimpleRecurrent, SmallCNN
from torchlog import select
from torchlog.errors import InterventionError, InvalidArgumentTypeError, InvalidOptionError
from torchlog.history import all_passes
from torchlog.interventions import add, noise, patch_from, replace_with, scale, zero_ablate
from torchlog.replay import replay


def _check_same_run(replayed: torchlog.ModelHistory, rerun: torchlog.ModelHistory) -> None:
    """Same passes in the same order, every value equal bit for bit, same firings."""
    mine, theirs = all_passes(replayed), all_passes(rerun)
    assert [p.label for p in mine] == [p.label for p in theirs]
    for a, b in zip(mine, theirs):
        assert a.tensor_meta == b.tensor_meta, a.label
        assert torch.equal(a.tensor_contents, b.tensor_contents), a.label
    assert len(replayed.interventions) == len(rerun.interventions) > 0
    for a, b in zip(replayed.interventions, rerun.interventions):
        assert (a.site, a.label, a.action, a.op_index, a.number) == (b.site, b.label, b.action, b.op_index, b.number)
        assert a.max_abs_change == b.max_abs_change or (math.isnan(a.max_abs_change) and math.isnan(b.max_abs_change))
        assert replayed[a.label].extra["interventions"] == rerun[b.label].extra["interventions"]


def _replay_and_rerun(model: nn.Module, x, intervene, **log) -> tuple[torchlog.ModelHistory, torchlog.ModelHistory]:
    history = torchlog.log_forward_pass(model, x, save_function_args=True, random_seed=0, **log)
    replayed = replay(history, intervene)
    check_history(replayed)
    return replayed, torchlog.log_forward_pass(model, x, random_seed=0, intervene=intervene, **log)


# ----- replay equals an intervened rerun -----------------------------------------------------
def test_the_seed_recurrent_model_with_its_second_linear_pass_zeroed() -> None:
    torch.manual_seed(0)
    model, x = SimpleRecurrent(), torch.rand(6, 5)
    history = torchlog.log_forward_pass(model, x, save_function_args=True, random_seed=0)
    zeroed = {"linear_1_1:2": zero_ablate()}
    replayed = replay(history, zeroed)
    _check_same_run(replayed, torchlog.log_forward_pass(model, x, random_seed=0, intervene=zeroed))
    h = x
    with torch.no_grad():  # the edit with plain torch
        for step in range(1, 5):
            h = model.fc(h) * (step != 2)
            assert torch.equal(replayed[f"add_1_2:{step}"].tensor_contents, h + 1)
            h = (h + 1) * 2
            assert torch.equal(replayed[f"mul_1_3:{step}"].tensor_contents, h)
    for label in ("input_1_0", "linear_1_1:1", "add_1_2:1", "mul_1_3:1"):  # upstream: shared
        assert replayed[label] is history[label]
        assert replayed[label].tensor_contents is history[label].tensor_contents
    for label in ("linear_1_1:2", "add_1_2:2", "linear_1_1:4", "output_1_4"):  # downstream: new
        assert replayed[label] is not history[label]
        assert not torch.equal(replayed[label].tensor_contents, history[label].tensor_contents)


@pytest.mark.parametrize("intervene", [
    {"linear_1_1": scale(2.0)},  # every pass of a loop, each recomputed from the one before
    {"fc": noise(0.1, seed=3)},  # every call of a module; noise seeded by the op's position
    {"fc:3": scale(0.5), select.func("add"): scale(3.0)},
    [("add_1_2:2", add(torch.ones(5))), (select.func("add") & ~select.in_module("fc"), scale(9.0)),
     (select.func("add"), scale(-1.0))],  # two actions on one op, in the order given
], ids=["label-every-pass", "module-noise", "call-and-selector", "two-on-one-op"])
def test_sites_of_every_kind_on_the_recurrent_model(intervene) -> None:
    torch.manual_seed(0)
    _check_same_run(*_replay_and_rerun(SimpleRecurrent(), torch.rand(3, 5), intervene))


@pytest.fixture(scope="module")
def cnn() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return SmallCNN().eval(), torch.randn(2, 3, 8, 8), torch.randn(2, 3, 8, 8)


@pytest.mark.parametrize("kind", ["module", "module-type", "op-selector", "label", "position", "patch",
                                  "exit-and-op", "mixed-selector"])
def test_a_small_cnn(cnn, kind) -> None:
    model, x, other = cnn
    source = torchlog.log_forward_pass(model, other)
    intervene = {
        "module": {"features.2": scale(-0.5)},
        "module-type": {select.module_type("ReLU"): zero_ablate(index=(slice(None), 1))},
        "op-selector": {select.func("conv2d") & select.in_module("features"): scale(0.5, index=(0, 1))},
        "label": {"maxpool2d_1_6": replace_with(torch.full((1, 4, 4, 4), 0.25))},
        "position": {-3: scale(3.0)},
        "patch": {"features": patch_from(source), "classifier.1": patch_from(source, index=0)},
        # op sites before the exit sites on the same values: the order a pass can keep
        "exit-and-op": {select.func("relu"): scale(0.5),
                        select.module("features.5") & select.func("relu"): scale(2.0),
                        "features": add(torch.ones(6), dim=1)},
        "mixed-selector": {select.module("features.2") | select.func("tanh"): scale(-1.0)},
    }[kind]
    _check_same_run(*_replay_and_rerun(model, x, intervene))


class TwoOutputs(nn.Module):
    """A module whose second output reads its first inside the call: the first output's
    module-exit action must not reach it, only the readers after the call."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        return h, torch.tanh(h)


class UsesBoth(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = TwoOutputs()
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        h, t = self.inner(x)
        return self.out(h * t)


def test_a_module_output_action_reaches_only_the_readers_after_the_call() -> None:
    torch.manual_seed(0)
    model, x = UsesBoth(), torch.randn(3, 4)
    intervene = {"inner.fc": scale(0.5), "inner": scale(-2.0), select.func("tanh"): scale(3.0)}
    replayed, rerun = _replay_and_rerun(model, x, intervene)
    _check_same_run(replayed, rerun)
    assert [r.site for r in replayed.interventions] == ["inner.fc", select.func("tanh"), "inner"]
    with torch.no_grad():
        h = model.inner.fc(x) * 0.5
        assert torch.equal(replayed[-1].tensor_contents, model.out((h * -2.0) * (torch.tanh(h) * 3.0)))


@pytest.mark.heavy
def test_a_tiny_gpt2() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=3, n_embd=32, n_head=4, vocab_size=100, n_positions=8,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids, other = torch.randint(0, 100, (1, 8)), torch.randint(0, 100, (1, 8))
    kwargs = {"use_cache": False}
    history = torchlog.log_forward_pass(model, ids, kwargs, save_function_args=True, random_seed=0)
    source = torchlog.log_forward_pass(model, other, kwargs)
    attention = select.func("scaled_dot_product_attention") & select.in_module("transformer.h.1")
    for intervene in ({"transformer.h.2": add(torch.randn(32))},
                      {"transformer.h.1": patch_from(source, index=(slice(None), 3))},
                      {attention: zero_ablate(index=(slice(None), 1))},
                      {select.module_type("GPT2MLP"): scale(0.5), -2: scale(2.0)}):
        replayed = replay(history, intervene)
        _check_same_run(replayed, torchlog.log_forward_pass(model, ids, kwargs, random_seed=0, intervene=intervene))
    replayed = replay(history, {"transformer.h.1": scale(0.5)})
    reached, pending = set(), [history["transformer.h.1"].label]
    while pending:  # the site and every pass that reads it, directly or not
        label = pending.pop()
        if label not in reached:
            reached.add(label)
            pending += history[label].children
    assert 0 < len(reached) < len(history)
    for record in history:  # the rest: the same records, not copies
        assert (replayed[record.label] is record) == (record.label not in reached), record.label
    replay(history, {"transformer.h.2.mlp": scale(0.5)}, verify=True, model=model, inputs=ids,
           input_kwargs=kwargs)  # ops that do not depend on values: verified


def test_random_ops_replay_with_their_recorded_rng_state() -> None:
    class Noisy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.drop = nn.Linear(6, 6), nn.Dropout(0.5)

        def forward(self, x):
            return self.drop(self.fc(x)) + torch.rand_like(x)

    torch.manual_seed(0)
    model = Noisy().train()
    replayed, rerun = _replay_and_rerun(model, torch.randn(4, 6), {"fc": scale(3.0)})
    _check_same_run(replayed, rerun)
    dropped = replayed["dropout_1_2"].tensor_contents
    assert (dropped == 0).any() and (dropped != 0).any()


class AddsInPlace(nn.Module):
    """An in-place op downstream of `b` whose target `a` is upstream: replay must not write
    into `a`'s saved value, which the source history and the replay share."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)

    def forward(self, x):
        h = self.a(x)
        h.add_(self.b(x))
        return torch.relu_(h)


def test_the_source_history_is_left_as_it_was() -> None:
    torch.manual_seed(0)
    model, x = AddsInPlace(), torch.randn(2, 3)
    history = torchlog.log_forward_pass(model, x, save_function_args=True, random_seed=0)
    records = list(all_passes(history))
    values = [p.tensor_contents.clone() for p in records]
    flip = {"b": scale(-1.0)}
    replayed = replay(history, flip)
    _check_same_run(replayed, torchlog.log_forward_pass(model, x, random_seed=0, intervene=flip))
    assert replayed["linear_1_1"].tensor_contents is history["linear_1_1"].tensor_contents
    assert all(a is b for a, b in zip(all_passes(history), records))
    assert all(torch.equal(p.tensor_contents, v) for p, v in zip(records, values))
    assert history.interventions == () and all("interventions" not in p.extra for p in records)


def test_a_history_logged_with_interventions_keeps_them() -> None:
    torch.manual_seed(0)
    model, x = SimpleRecurrent(), torch.rand(2, 5)
    first, later = {"fc:3": zero_ablate()}, {"fc:4": scale(2.0)}
    history = torchlog.log_forward_pass(model, x, save_function_args=True, random_seed=0, intervene=first)
    replayed = replay(history, later, verify=True, model=model, inputs=x)
    both = torchlog.log_forward_pass(model, x, random_seed=0, intervene=[*first.items(), *later.items()])
    _check_same_run(replayed, both)
    with pytest.raises(InterventionError, match=r"'linear_1_1:3'.*logged with changed it"):
        replay(history, {"fc:1": scale(2.0)})  # would recompute the zeroed pass without zeroing it


# ----- verify --------------------------------------------------------------------------------
class Branching(nn.Module):
    """Which op runs depends on the sign of a value: replay cannot see the other branch."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        h = self.fc(x)
        if h.sum() > 0:
            return torch.relu(h)
        return -h


def test_verify_names_the_first_pass_where_a_data_dependent_branch_parts() -> None:
    torch.manual_seed(0)
    model, x = Branching(), torch.randn(2, 3)
    history = torchlog.log_forward_pass(model, x, save_function_args=True, random_seed=0)
    flip = {"fc": scale(-1.0)}
    unverified = replay(history, flip)  # replays the logged branch
    rerun = torchlog.log_forward_pass(model, x, random_seed=0, intervene=flip)
    assert unverified.layer_labels != rerun.layer_labels
    with pytest.raises(InterventionError, match="verify") as caught:
        replay(history, flip, verify=True, model=model, inputs=x)
    branch = history.layer_labels[-2]  # the op the logged run took and the rerun did not
    assert repr(branch) in str(caught.value) and repr(rerun.layer_labels[-2]) in str(caught.value)
    assert caught.value.torchlog_history.layer_labels == unverified.layer_labels
    replay(history, {"fc": scale(2.0)}, verify=True, model=model, inputs=x)  # same branch: passes


def test_verify_names_a_pass_whose_value_differs() -> None:
    class Stateful(nn.Module):
        """Adds a count of its calls: the saved ops cannot know it changes."""

        def __init__(self) -> None:
            super().__init__()
            self.fc, self.calls = nn.Linear(3, 3), 0

        def forward(self, x):
            self.calls += 1
            return self.fc(x) * 2 + self.calls

    torch.manual_seed(0)
    model, x = Stateful(), torch.randn(2, 3)
    history = torchlog.log_forward_pass(model, x, save_function_args=True)
    with pytest.raises(InterventionError, match=r"'add_1_3' differs"):
        replay(history, {"fc": scale(2.0)}, verify=True, model=model, inputs=x)


# ----- refusals and bad input ----------------------------------------------------------------
def test_a_history_without_function_arguments_is_refused_naming_the_fix() -> None:
    history = torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5))
    with pytest.raises(InvalidOptionError, match=r"save_function_args=True"):
        replay(history, {"fc": scale(2.0)})


def test_a_random_op_without_its_rng_state_is_refused() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 1)).train()
    history = torchlog.log_forward_pass(model, torch.randn(3, 4), save_function_args=True)
    history["dropout_1_2"].rng_state = None  # as a log that lost its RNG states would hold it
    with pytest.raises(InterventionError, match=r"'dropout_1_2'.*RNG state is missing"):
        replay(history, {"0": scale(2.0)})
    assert replay(history, {"2": scale(2.0)})["linear_2_3"] is not None  # downstream of the dropout only


class CountsIntoABuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.register_buffer("total", torch.zeros(3))

    def forward(self, x):
        h = self.fc(x)
        self.total.add_(h.sum(0))
        return h * 2


class WritesThroughAView(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        h = self.fc(x)
        row = h[0]
        h.mul_(2)  # also changes row
        return row * 3


@pytest.mark.parametrize("model, why", [
    (CountsIntoABuffer(), r"'add_1_4'.*writes in place into buffer 'buffer_1_3' \(total\)"),
    (WritesThroughAView(), r"'mul_2_4'.*a view after an in-place write"),
])
def test_ops_that_cannot_be_replayed_are_refused_with_their_label_and_why(model, why) -> None:
    history = torchlog.log_forward_pass(model, torch.randn(2, 3), save_function_args=True)
    with pytest.raises(InterventionError, match=why):
        replay(history, {"fc": scale(2.0)})


def test_bad_sites_actions_and_arguments() -> None:
    torch.manual_seed(0)
    model, x = SimpleRecurrent(), torch.rand(2, 5)
    history = torchlog.log_forward_pass(model, x, save_function_args=True)
    with pytest.raises(InterventionError, match=r"'linear_1_9'.*closest: linear_1_1"):
        replay(history, {"linear_1_9": scale(2.0)})
    with pytest.raises(InterventionError, match=r"'input_1_0'.*no op of the model made"):
        replay(history, {"input_1_0": scale(2.0)})
    with pytest.raises(InterventionError, match=r"shape \(5,\) for a value of shape \(2, 5\)"):
        replay(history, {"fc:1": lambda value, firing: value[0]})
    with pytest.raises(InterventionError, match=r"raised ZeroDivisionError") as caught:
        replay(history, {"fc:1": lambda value, firing: 1 / 0})
    assert isinstance(caught.value.__cause__, ZeroDivisionError)
    with pytest.raises(InvalidArgumentTypeError, match=r"ModelHistory"):
        replay(model, {"fc": scale(2.0)})
    with pytest.raises(InvalidArgumentTypeError, match=r"action for site 'fc'"):
        replay(history, {"fc": 2.0})
    with pytest.raises(InvalidOptionError, match=r"intervene=\{site: action\}"):
        replay(history, None)
    with pytest.raises(InvalidOptionError, match=r"model= and inputs="):
        replay(history, {"fc": scale(2.0)}, verify=True)
    with pytest.raises(InterventionError, match=r"'linear_1_1:1' kept no saved value to act on"):
        replay(torchlog.log_forward_pass(model, x, save_function_args=True, layers_to_save=["add_1_2"]),
               {"fc": scale(2.0)})


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)

    def forward(self, x):
        h = self.a(x)
        return self.b(h) + h


def test_a_downstream_op_whose_other_parent_was_not_saved_is_refused() -> None:
    torch.manual_seed(0)
    model, x = Residual(), torch.randn(2, 3)
    pruned = torchlog.log_forward_pass(model, x, save_function_args=True, layers_to_save=["b"])
    with pytest.raises(InterventionError, match=r"'add_1_3'.*parent 'linear_1_1' kept no saved value.*"
                                                r"layers_to_save='all'"):
        replay(pruned, {"b": scale(2.0)})
    # Where every parent the replay reads is saved or recomputed, the rest need not be saved.
    only = torchlog.log_forward_pass(model, x, save_function_args=True, layers_to_save=["a"])
    want = torchlog.log_forward_pass(model, x, intervene={"a": scale(2.0)})
    assert torch.equal(all_passes(replay(only, {"a": scale(2.0)}))[-1].tensor_contents, want[-1].tensor_contents)
