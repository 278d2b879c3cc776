"""Tests of interventions (torchlog/interventions, torchlog/select.py, capture/plan.py).

Oracles, not self-consistency: a module-address intervention equals the same edit made by a
plain forward hook on a plain forward; an op-level one equals the same edit written into a
copy of the model's code; each action equals its formula computed with plain torch.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlog
from tests.invariants import check_history
from tests.models import SimpleRecurrent, SmallCNN
from tests.state_snapshot import differences, take
from torchlog import select
from torchlog.errors import InterventionError, InvalidArgumentTypeError
from torchlog.interventions import (add, clamp, mean_ablate, noise, patch_from, project_out,
                                    replace_with, scale, splice, zero_ablate)


class TanhMLP(nn.Module):
    """Ops that are no module's output: `tanh(h) * 2` between two linears."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 6), nn.Linear(6, 2)

    def forward(self, x):
        h = torch.tanh(self.fc1(x)) * 2
        return self.fc2(h + 1)


def _cnn() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return SmallCNN().eval(), torch.randn(2, 3, 8, 8)


def _module_outputs(model: nn.Module, x: torch.Tensor, edit: tuple[str, object] | None = None) -> dict:
    """Every module call's first output tensor on a plain forward, with `edit` = (address,
    fn(output) -> new output) done by a forward hook: the oracle."""
    seen: dict[str, list] = {}
    handles = []
    for address, module in model.named_modules():
        if not address:
            continue

        def record(mod, args, out, address=address):
            if edit is not None and address == edit[0]:
                out = edit[1](out)
            seen.setdefault(address, []).append(out.detach().clone())
            return out

        handles.append(module.register_forward_hook(record))
    try:
        with torch.no_grad():
            output = model(x)
    finally:
        for handle in handles:
            handle.remove()
    seen[""] = [output]
    return seen


def _history_module_outputs(history: torchlog.ModelHistory) -> dict:
    found = {address: [history[labels[0]].tensor_contents for labels in record.call_outputs]
             for address, record in history.modules.items()}
    found[""] = [history[history.output_layers[0]].tensor_contents]
    return found


# ----- module addresses against forward hooks ---------------------------------------------------
@pytest.mark.parametrize("address", ["features.2", "features.4", "classifier.2", "features"])
@pytest.mark.parametrize("action,edit", [
    (zero_ablate(), torch.zeros_like),
    (scale(-0.5), lambda t: t * -0.5),
    (zero_ablate(index=(slice(None), 1)), lambda t: t.index_fill(1, torch.tensor([1]), 0.0)),
])
def test_a_module_site_equals_a_forward_hook_doing_the_same(address, action, edit) -> None:
    model, x = _cnn()
    before = take(model)
    history = torchlog.log_forward_pass(model, x, intervene={address: action})
    assert differences(before, take(model)) == []
    check_history(history)
    want = _module_outputs(model, x, (address, edit))
    got = _history_module_outputs(history)
    edited = history[address].label
    for key in want:  # every module's output, the edited one and all downstream of it
        if key != address and history.modules.get(key) and history[key].label == edited:
            # An inner module whose output is the same pass (features.5 returns what features
            # returns): the pass holds what flows downstream, the edited value.
            assert torch.equal(got[key][0], want[address][0]), key
            continue
        for a, b in zip(got[key], want[key]):
            assert torch.equal(a, b), key
    (record,) = history.interventions
    assert record.site == address and record.label == history[address].label
    assert record.max_abs_change == pytest.approx(float((history[address].tensor_contents.detach()
                                                         - _module_outputs(model, x)[address][0]).abs().max()))


def test_a_module_type_selector_reaches_every_module_of_that_class() -> None:
    model, x = _cnn()
    history = torchlog.log_forward_pass(model, x, intervene={select.module_type("ReLU"): scale(2.0)})
    assert [r.site for r in history.interventions] == [select.module_type("ReLU")] * 2

    def double_relus(module):
        return [m.register_forward_hook(lambda m, a, out: out * 2.0) for m in module.modules()
                if isinstance(m, nn.ReLU)]

    handles = double_relus(model)
    try:
        with torch.no_grad():
            want = model(x)
    finally:
        for handle in handles:
            handle.remove()
    assert torch.equal(history[history.output_layers[0]].tensor_contents, want)


def test_one_call_of_a_module_called_in_a_loop() -> None:
    torch.manual_seed(0)
    model, x = SimpleRecurrent(), torch.rand(6, 5)
    history = torchlog.log_forward_pass(model, x, intervene={"fc:3": scale(0.0)})
    assert [r.label for r in history.interventions] == ["linear_1_1:3"]
    calls = []

    def hook(module, args, out):
        calls.append(1)
        return out * 0.0 if len(calls) == 3 else out

    handle = model.fc.register_forward_hook(hook)
    try:
        want = model(x)
    finally:
        handle.remove()
    assert torch.equal(history[-1].tensor_contents, want.detach())


# ----- ops against an edited copy of the model's code -------------------------------------------
class EditedRecurrent(SimpleRecurrent):
    """SimpleRecurrent with the second pass of fc zeroed in its code."""

    def forward(self, x):
        passes = []
        for r in range(4):
            x = self.fc(x)
            if r == 1:
                x = torch.zeros_like(x)
            a = x + 1
            x = a * 2
            passes.append((x.detach(),))
        return x


def test_the_seed_recurrent_model_with_its_second_linear_pass_zeroed() -> None:
    torch.manual_seed(0)
    model, x = SimpleRecurrent(), torch.rand(6, 5)
    clean = torchlog.log_forward_pass(model, x, random_seed=0)
    history = torchlog.log_forward_pass(model, x, random_seed=0, intervene={"linear_1_1:2": zero_ablate()})
    check_history(history)
    # The same edit written into the code, pass by pass.
    edited = EditedRecurrent()
    edited.load_state_dict(model.state_dict())
    h, want = x, {}
    with torch.no_grad():
        for step in range(1, 5):
            h = edited.fc(h)
            if step == 2:
                h = torch.zeros_like(h)
            want[f"linear_1_1:{step}"] = h
            want[f"add_1_2:{step}"] = h = h + 1
            want[f"mul_1_3:{step}"] = h = h * 2
        assert torch.equal(edited(x), h)
    for label, value in want.items():
        assert torch.equal(history[label].tensor_contents, value), label
    for label in ("linear_1_1:1", "add_1_2:1", "mul_1_3:1"):  # before the site: unchanged
        assert torch.equal(history[label].tensor_contents, clean[label].tensor_contents)
    for step in (2, 3, 4):  # after it: every later layer changed
        assert not torch.equal(history[f"mul_1_3:{step}"].tensor_contents, clean[f"mul_1_3:{step}"].tensor_contents)


class EditedTanhMLP(TanhMLP):
    def forward(self, x):
        h = (torch.tanh(self.fc1(x)) * 2) * 0.25
        return self.fc2(h + 1)


@pytest.mark.parametrize("site", ["mul_1_3", select.func("mul"), select.func("mul") & select.in_module("fc1") | select.func("mul"),
                                  select.where(lambda op: op.func_name == "mul"), -4])
def test_an_op_site_equals_the_edit_written_into_the_code(site) -> None:
    torch.manual_seed(0)
    model, x = TanhMLP(), torch.randn(3, 4)
    edited = EditedTanhMLP()
    edited.load_state_dict(model.state_dict())
    history = torchlog.log_forward_pass(model, x, intervene={site: scale(0.25)})
    assert [r.label for r in history.interventions] == ["mul_1_3"]
    assert torch.equal(history[-1].tensor_contents, edited(x).detach())
    assert torch.equal(history["add_1_4"].tensor_contents, (torch.tanh(model.fc1(x)) * 2 * 0.25 + 1).detach())


def test_every_pass_of_a_loop_is_reached_by_a_label_without_pass_number_and_by_a_selector() -> None:
    torch.manual_seed(0)
    model, x = SimpleRecurrent(), torch.rand(6, 5)
    by_label = torchlog.log_forward_pass(model, x, intervene={"add_1_2": scale(0.5)})
    by_selector = torchlog.log_forward_pass(model, x, intervene={select.func("add"): scale(0.5)})
    assert [r.label for r in by_label.interventions] == [f"add_1_2:{k}" for k in range(1, 5)]
    assert [r.label for r in by_selector.interventions] == [f"add_1_2:{k}" for k in range(1, 5)]
    h = x
    with torch.no_grad():
        for _ in range(4):
            h = ((model.fc(h) + 1) * 0.5) * 2
    assert torch.equal(by_label[-1].tensor_contents, h) and torch.equal(by_selector[-1].tensor_contents, h)


def test_two_actions_on_one_op_apply_in_the_order_given() -> None:
    torch.manual_seed(0)
    model, x = TanhMLP(), torch.randn(3, 4)
    first = torchlog.log_forward_pass(model, x, intervene=[("mul_1_3", add(torch.ones(6))), (select.func("mul"), scale(3.0))])
    second = torchlog.log_forward_pass(model, x, intervene=[(select.func("mul"), scale(3.0)), ("mul_1_3", add(torch.ones(6)))])
    value = (torch.tanh(model.fc1(x)) * 2).detach()
    assert torch.equal(first["mul_1_3"].tensor_contents, (value + 1) * 3)
    assert torch.equal(second["mul_1_3"].tensor_contents, value * 3 + 1)


def test_an_in_place_op_site_changes_what_the_model_reads_next() -> None:
    class InPlaceRelu(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            h = self.fc(x)
            h.relu_()  # its result is not used: the edit must land in h
            return h * 2

    torch.manual_seed(0)
    model, x = InPlaceRelu(), torch.randn(4, 3)
    history = torchlog.log_forward_pass(model, x, intervene={select.func("relu"): add(torch.full((3,), 5.0))})
    with torch.no_grad():
        want = (torch.relu(model.fc(x)) + 5) * 2
    assert torch.equal(history[-1].tensor_contents, want)


def test_each_firing_summarises_the_value_before_the_action_as_statistics_does() -> None:
    from torchlog.statistics import summarize

    model, x = _net()
    history = torchlog.log_forward_pass(model, x, intervene={"relu_1_2": scale(3.0), "1": add(torch.ones(5))})
    want = summarize(_relu_value(model, x))  # the oracle: the plain forward's relu output
    first, second = history.interventions
    for name in ("numel", "num_nan", "num_inf", "zeros"):
        assert first.before[name] == getattr(want, name)
    for name in ("min", "max", "mean", "std"):
        assert first.before[name] == pytest.approx(getattr(want, name), rel=1e-6, abs=1e-7)
    # The second action sees the first one's result: three times the relu output.
    assert second.before["max"] == pytest.approx(3 * want.max, rel=1e-6)
    assert second.before["std"] == pytest.approx(3 * want.std, rel=1e-6)
    assert history["relu_1_2"].extra["interventions"][0]["before"] == first.before


def test_a_module_site_listed_before_an_op_site_on_the_same_value_is_refused_not_reordered() -> None:
    """Module sites act when the module returns, after the op's own sites: listing the module
    first asks for an order the pass cannot keep, so it is an error, not a silent swap."""
    model, x = _net()
    with pytest.raises(InterventionError, match=r"sites '1' and 'relu_1_2' both change op .* list '1' after 'relu_1_2'"):
        torchlog.log_forward_pass(model, x, intervene={"1": scale(3.0), "relu_1_2": add(torch.ones(5))})
    inner = nn.Sequential(nn.Sequential(nn.Linear(4, 5), nn.ReLU()), nn.Linear(5, 2))
    with pytest.raises(InterventionError, match=r"sites '0' and '0.1' both change op"):
        torchlog.log_forward_pass(inner, x, intervene={"0": scale(3.0), "0.1": add(torch.ones(5))})
    # Replay refuses the same order with the same words.
    from torchlog.replay import replay

    logged = torchlog.log_forward_pass(model, x, save_function_args=True)
    with pytest.raises(InterventionError, match=r"sites '1' and 'relu_1_2' both change op .* list '1' after 'relu_1_2'"):
        replay(logged, {"1": scale(3.0), "relu_1_2": add(torch.ones(5))})
    # In the order the pass can keep, both act, in that order.
    history = torchlog.log_forward_pass(inner, x, intervene={"0.1": add(torch.ones(5)), "0": scale(3.0)})
    with torch.no_grad():
        want = inner[1]((inner[0](x) + 1) * 3)
    torch.testing.assert_close(history[-1].tensor_contents, want)


def test_patch_from_and_replay_refuse_a_history_of_postfunc_results_not_activations(tmp_path) -> None:
    """A run logged with activation_postfunc saved that function's results: patching them in,
    or re-running ops from them, would use other values than the activations (here the same
    shape, so no shape check would catch it)."""
    from torchlog.errors import InvalidOptionError
    from torchlog.replay import replay

    model, x = _net()
    postfunc = torch.abs
    source = torchlog.log_forward_pass(model, x, activation_postfunc=postfunc, save_function_args=True)
    assert source.info.activation_postfunc == "abs"
    with pytest.raises(InvalidOptionError, match=r"patch_from: .* activation_postfunc=abs, .* without activation_postfunc"):
        patch_from(source)
    with pytest.raises(InvalidOptionError, match=r"activation_postfunc=abs, .* without activation_postfunc"):
        replay(source, {"relu_1_2": scale(2.0)})
    pytest.importorskip("h5py")
    torchlog.log_forward_pass(model, x, activation_postfunc=postfunc, save_to=str(tmp_path / "abs.h5"))
    with pytest.raises(InvalidOptionError, match="activation_postfunc=abs"):  # a log file keeps the name
        patch_from(torchlog.load(str(tmp_path / "abs.h5")))
    plain = torchlog.log_forward_pass(model, x)
    assert plain.info.activation_postfunc is None
    patch_from(plain)  # the control: a plain run is accepted


def test_the_before_summary_of_an_in_place_op_is_the_value_before_the_edit_landed() -> None:
    from torchlog.statistics import summarize

    class InPlace(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            h = self.fc(x)
            h.relu_()
            return h * 2

    torch.manual_seed(0)
    model, x = InPlace(), torch.randn(4, 3)
    history = torchlog.log_forward_pass(model, x, intervene={select.func("relu"): zero_ablate()})
    (record,) = history.interventions
    with torch.no_grad():
        want = summarize(torch.relu(model.fc(x)))
    assert want.max > 0  # the control: the edit (zeros) would read max 0
    assert record.before["max"] == pytest.approx(want.max, rel=1e-6)
    assert record.before["mean"] == pytest.approx(want.mean, rel=1e-6)


# ----- each action against its formula ------------------------------------------------------------
def _relu_value(model, x):
    with torch.no_grad():
        return torch.relu(model[0](x))


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2)), torch.randn(3, 4)


@pytest.mark.parametrize("action,formula", [
    (zero_ablate(), lambda v: torch.zeros_like(v)),
    (mean_ablate(0), lambda v: v.mean(0, keepdim=True).expand_as(v)),
    (scale(3.0), lambda v: v * 3.0),
    (clamp(0.1, 0.3), lambda v: v.clamp(0.1, 0.3)),
    (add(torch.arange(5.0), alpha=0.5), lambda v: v + 0.5 * torch.arange(5.0)),
    (add(torch.arange(3.0), dim=0), lambda v: v + torch.arange(3.0)[:, None]),
    (replace_with(torch.ones(5)), lambda v: torch.ones(3, 5)),
    (splice(nn.Identity()), lambda v: v),
    (scale(0.0, index=(slice(None), 2)), lambda v: v.index_fill(1, torch.tensor([2]), 0.0)),
    (lambda value, firing: value - 1, lambda v: v - 1),
    (torch.full((3, 5), 7.0), lambda v: torch.full((3, 5), 7.0)),
])
def test_each_action_computes_its_formula(action, formula) -> None:
    model, x = _net()
    history = torchlog.log_forward_pass(model, x, intervene={"relu_1_2": action})
    want = formula(_relu_value(model, x))
    assert torch.allclose(history["relu_1_2"].tensor_contents, want, rtol=0, atol=1e-6)
    with torch.no_grad():
        assert torch.allclose(history[-1].tensor_contents, model[2](want), rtol=1e-6, atol=1e-6)


def test_noise_is_reproducible_and_leaves_the_global_rng_alone() -> None:
    model, x = _net()
    state = torch.get_rng_state()
    one = torchlog.log_forward_pass(model, x, random_seed=3, intervene={"1": noise(0.5, seed=9)})
    two = torchlog.log_forward_pass(model, x, random_seed=3, intervene={"1": noise(0.5, seed=9)})
    other = torchlog.log_forward_pass(model, x, random_seed=3, intervene={"1": noise(0.5, seed=10)})
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(one["relu_1_2"].tensor_contents, two["relu_1_2"].tensor_contents)
    assert not torch.equal(one["relu_1_2"].tensor_contents, other["relu_1_2"].tensor_contents)
    drawn = one["relu_1_2"].tensor_contents - _relu_value(model, x)
    assert 0.1 < float(drawn.std()) < 1.5


def test_project_out_leaves_no_component_along_the_direction() -> None:
    model, x = _net()
    direction = torch.tensor([1.0, 2.0, 0.0, -1.0, 0.5])
    history = torchlog.log_forward_pass(model, x, intervene={"relu_1_2": project_out(direction)})
    value = history["relu_1_2"].tensor_contents
    assert torch.allclose(value @ direction, torch.zeros(3), atol=1e-5)
    original = _relu_value(model, x)
    unit = direction / direction.norm()
    assert torch.allclose(value, original - (original @ unit)[:, None] * unit, atol=1e-6)


def test_patch_from_copies_the_same_site_of_another_run() -> None:
    model, x = _net()
    other_x = torch.randn(3, 4)
    source = torchlog.log_forward_pass(model, other_x)
    for site in ("relu_1_2", "1", select.func("relu")):
        patched = torchlog.log_forward_pass(model, x, intervene={site: patch_from(source)})
        assert torch.equal(patched["relu_1_2"].tensor_contents, source["relu_1_2"].tensor_contents)
        assert torch.equal(patched[-1].tensor_contents, source[-1].tensor_contents)
    part = torchlog.log_forward_pass(model, x, intervene={"1": patch_from(source, index=(0,))})
    want = _relu_value(model, x).clone()
    want[0] = source["relu_1_2"].tensor_contents[0]
    assert torch.equal(part["relu_1_2"].tensor_contents, want)


def test_actions_have_short_reprs_naming_them_and_their_parameters() -> None:
    assert repr(zero_ablate(index=(slice(None), 3))) == "zero_ablate(index=[:, 3])"
    assert repr(scale(2.0)) == "scale(k=2.0)"
    assert repr(clamp(max=1.0)) == "clamp(min=None, max=1.0)"
    assert repr(add(torch.ones(4), alpha=2.0)) == "add(vector=<tensor (4,) float32>, alpha=2.0, dim=-1)"
    assert repr(mean_ablate((0, 1))) == "mean_ablate(dims=(0, 1))"
    assert repr(noise(0.1, seed=3)) == "noise(std=0.1, seed=3)"


# ----- gradients --------------------------------------------------------------------------------
def test_a_steering_vector_that_requires_grad_gets_the_gradient_a_hook_would_give() -> None:
    model, x = _net()
    vector = torch.zeros(5, requires_grad=True)
    history = torchlog.log_forward_pass(model, x, intervene={"1": add(vector)})
    history[-1].tensor_contents.sum().backward()
    mine = vector.grad.clone()
    oracle_vector = torch.zeros(5, requires_grad=True)
    handle = model[1].register_forward_hook(lambda m, a, out: out + oracle_vector)
    try:
        model(x).sum().backward()
    finally:
        handle.remove()
    assert torch.allclose(mine, oracle_vector.grad) and mine.abs().sum() > 0


def test_save_gradients_gives_the_gradient_with_respect_to_the_replacement() -> None:
    model, x = _net()
    for site in ("relu_1_2", "1"):  # the op site and the module site
        model.zero_grad()
        history = torchlog.log_forward_pass(model, x, save_gradients=True, intervene={site: scale(3.0)})
        history.log_backward(history[-1].tensor_contents.sum())
        replaced = {}
        handle = model[1].register_forward_hook(lambda m, a, out: replaced.setdefault("t", out * 3.0))
        try:
            out = model(x)
        finally:
            handle.remove()
        replaced["t"].retain_grad()
        out.sum().backward()
        assert torch.allclose(history["relu_1_2"].grad_contents, replaced["t"].grad), site


# ----- nothing silent: errors -------------------------------------------------------------------
class Counting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.calls = nn.Linear(4, 4), 0

    def forward(self, x):
        self.calls += 1
        return torch.relu(self.fc(x))


def test_a_label_that_matches_nothing_names_the_site_and_the_closest_labels() -> None:
    model, x = _net()
    with pytest.raises(InterventionError, match=r"'relu_1_3' matches no pass.*closest: relu_1_2"):
        torchlog.log_forward_pass(model, x, intervene={"relu_1_3": zero_ablate()})


def test_an_unknown_module_is_refused_before_the_model_runs() -> None:
    model = Counting()
    with pytest.raises(InterventionError, match=r"module 'fx'.*closest: fc"):
        torchlog.log_forward_pass(model, torch.ones(2, 4), intervene={select.module("fx"): zero_ablate()})
    with pytest.raises(InterventionError, match=r"module type 'Linea'.*closest: Linear"):
        torchlog.log_forward_pass(model, torch.ones(2, 4), intervene={select.module_type("Linea"): zero_ablate()})
    assert model.calls == 0


def test_a_selector_that_never_matches_raises_at_the_end_with_the_history() -> None:
    model = Counting()
    with pytest.raises(InterventionError, match=r"func\('softmax'\) matched no pass") as caught:
        torchlog.log_forward_pass(model, torch.ones(2, 4), intervene={select.func("softmax"): zero_ablate()})
    assert caught.value.torchlog_history.layer_labels[1] == "linear_1_1"
    with pytest.raises(InterventionError, match=r"'fc:2' matched no pass"):  # fc runs once
        torchlog.log_forward_pass(model, torch.ones(2, 4), intervene={"fc:2": zero_ablate()})


@pytest.mark.parametrize("value,message", [
    (torch.ones(2, 3), r"shape \(2, 3\) does not broadcast to the value's shape \(3, 5\)"),
    (torch.ones(5, dtype=torch.float64), r"the replacement is torch.float64 on cpu, the value torch.float32"),
    (lambda value, firing: value[:, :2], r"returned shape \(3, 2\) for a value of shape \(3, 5\)"),
    (lambda value, firing: value.double(), r"returned dtype torch.float64 for a value of dtype torch.float32"),
    (lambda value, firing: None, r"returned None; an intervention callable must return the new value"),
])
def test_a_wrong_replacement_names_the_site_the_pass_and_both_shapes(value, message) -> None:
    model, x = _net()
    before = take(model)
    with pytest.raises(InterventionError, match=message) as caught:
        torchlog.log_forward_pass(model, x, intervene={"relu_1_2": value})
    assert "'relu_1_2'" in str(caught.value) and "op 2 ('relu')" in str(caught.value)
    assert caught.value.torchlog_history.is_partial
    assert differences(before, take(model)) == []


def test_an_action_that_raises_comes_out_chained_with_the_partial_history_and_state_intact() -> None:
    class CatchesEverything(nn.Module):  # an except Exception in forward must not swallow it
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            try:
                return torch.relu(self.fc(x))
            except Exception:
                return x

    def broken(value, firing):
        raise ValueError("the action's own bug")

    model = CatchesEverything()
    before = take(model)
    with pytest.raises(InterventionError, match=r"raised ValueError at op .*the action's own bug") as caught:
        torchlog.log_forward_pass(model, torch.ones(2, 3), intervene={"fc": broken})
    assert isinstance(caught.value.__cause__, ValueError)
    assert caught.value.torchlog_history.layer_labels == ["input_1_0", "linear_1_1"]
    assert differences(before, take(model)) == []


@pytest.mark.parametrize("intervene,error,message", [
    ({"relu_1_2": 3}, InvalidArgumentTypeError, r"the action for site 'relu_1_2' is 3 of type int"),
    ({3.5: zero_ablate()}, InvalidArgumentTypeError, r"intervene site 3.5 of type float"),
    ([("relu_1_2",)], InvalidArgumentTypeError, r"\(site, action\) pairs"),
    ("relu_1_2", InvalidArgumentTypeError, r"intervene must be a dict"),
    ({}, torchlog.InvalidOptionError, r"intervene is empty"),
])
def test_bad_intervene_values_are_refused_before_anything_runs(intervene, error, message) -> None:
    model = Counting()
    with pytest.raises(error, match=message):
        torchlog.log_forward_pass(model, torch.ones(2, 4), intervene=intervene)
    assert model.calls == 0


def test_a_selector_combined_with_a_plain_value_is_refused() -> None:
    with pytest.raises(InvalidArgumentTypeError, match=r"combined with another selector.*select.label\('relu_1_2'\)"):
        select.func("relu") & "relu_1_2"
    with pytest.raises(InvalidArgumentTypeError, match=r"select.func takes a non-empty str"):
        select.func(3)


class ChangesItsMind(nn.Module):
    """Its first call runs relu, later ones sigmoid first: a probe and a later pass differ."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        x = torch.relu(x) if self.calls == 1 else torch.sigmoid(x)
        return x * 2


def test_labels_found_in_a_pass_that_ran_other_ops_are_refused_not_applied_to_the_wrong_op() -> None:
    # A substring is resolved on a probe (the first call), and the pass (the second) differs.
    with pytest.raises(InterventionError, match=r"op 1 is 'sigmoid' where that pass had 'relu'"):
        torchlog.log_forward_pass(ChangesItsMind(), torch.ones(3), intervene={"mul": zero_ablate()})


def test_a_full_label_outside_loops_acts_in_the_one_pass_it_runs() -> None:
    """A label whose last number is its node's index (no loop before it) is acted on as the
    pass runs, with no probe: the same model as above runs once and its label acts."""
    model = ChangesItsMind()
    history = torchlog.log_forward_pass(model, torch.ones(3), intervene={"mul_1_2": zero_ablate()})
    assert model.calls == 1 and [r.label for r in history.interventions] == ["mul_1_2"]
    assert torch.equal(history[-1].tensor_contents, torch.zeros(3))


# ----- stop early ----------------------------------------------------------------------------------
def test_stop_after_a_module_call_runs_nothing_after_it_and_leaves_state_alone() -> None:
    class Tracked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.second, self.ran = nn.Linear(3, 3), nn.Linear(3, 3), []

        def forward(self, x):
            self.ran.append("first")
            x = self.first(x)
            self.ran.append("second")
            return self.second(torch.relu(x))

    model = Tracked()
    before = take(model)
    history = torchlog.log_forward_pass(model, torch.ones(2, 3), stop_after="first:1")
    assert model.ran == ["first"]  # one call: nothing after the stop, no probe
    assert history.stopped_at == "linear_1_1" and history.layer_labels == ["input_1_0", "linear_1_1"]
    assert not history.is_partial and history.output_layers == []
    model.ran.clear()
    assert differences(before, take(model)) == []
    by_label = torchlog.log_forward_pass(model, torch.ones(2, 3), stop_after="relu_1_2")
    assert by_label.stopped_at == "relu_1_2" and by_label.layer_labels[-1] == "relu_1_2"
    assert torch._C._len_torch_function_stack() == 0


def test_stop_after_a_layer_without_pass_number_stops_after_its_last_pass() -> None:
    torch.manual_seed(0)
    history = torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5), stop_after="add_1_2")
    assert history.stopped_at == "add_1_2:4" and history.layer_labels[-1] == "add_1_2:4"
    second = torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5), stop_after="linear_1_1:2")
    assert second.layer_labels[-1] == "linear_1_1:2"


def test_a_site_after_the_stop_is_an_error_not_a_no_op() -> None:
    model, x = _net()
    with pytest.raises(InterventionError, match=r"before the pass was stopped after 'linear_1_1'"):
        torchlog.log_forward_pass(model, x, stop_after="0:1", intervene={"2": zero_ablate()})


def test_stop_after_naming_nothing_is_refused() -> None:
    model, x = _net()
    with pytest.raises(InterventionError, match=r"stop_after site 'conv2d' matches no pass"):
        torchlog.log_forward_pass(model, x, stop_after="conv2d")


def test_stop_after_with_save_to_writes_a_complete_log(tmp_path) -> None:
    pytest.importorskip("h5py")
    model, x = _net()
    path = tmp_path / "stopped.h5"
    history = torchlog.log_forward_pass(model, x, stop_after="relu_1_2", save_to=str(path),
                                        intervene={"relu_1_2": scale(2.0)})
    loaded = torchlog.load(str(path))
    assert loaded.layer_labels == history.layer_labels == ["input_1_0", "linear_1_1", "relu_1_2"]
    assert not loaded.is_partial
    assert torch.equal(loaded["relu_1_2"].tensor_contents, 2.0 * _relu_value(model, x))


# ----- the same selectors save layers -------------------------------------------------------------
def test_layers_to_save_takes_selectors() -> None:
    model, x = _cnn()
    history = torchlog.log_forward_pass(model, x, layers_to_save=[select.func("relu") & select.in_module("features")])
    assert history.layer_labels == ["relu_1_5", "relu_2_8"]
    both = torchlog.log_forward_pass(model, x, layers_to_save=[select.module("classifier.1"), "conv2d_1_1"])
    assert both.layer_labels == ["conv2d_1_1", "linear_1_10"]


def test_intervening_with_a_layers_to_save_list_saves_the_intervened_values() -> None:
    model, x = _net()
    history = torchlog.log_forward_pass(model, x, layers_to_save=["relu", "linear_2_3"],
                                        intervene={"linear_1_1": zero_ablate()})
    assert history.layer_labels == ["relu_1_2", "linear_2_3"]
    assert torch.equal(history["relu_1_2"].tensor_contents, torch.zeros(3, 5))
    assert [r.label for r in history.interventions] == ["linear_1_1"]  # found though not saved


def test_print_says_how_many_interventions_fired_and_the_pass_printout_names_the_action() -> None:
    model, x = _net()
    history = torchlog.log_forward_pass(model, x, intervene={"relu_1_2": scale(0.5)})
    assert "Interventions: 1 fired" in str(history)
    text = str(history["relu_1_2"])
    assert "scale(k=0.5)" in text and "max |change|" in text


def test_each_action_runs_once_per_firing_even_when_labels_need_a_first_pass() -> None:
    model, x = _net()
    seen = []

    def spy(value, firing):
        seen.append(firing.op_index)
        return value

    history = torchlog.log_forward_pass(model, x, intervene=[(select.func("relu"), spy), ("linear_2_3", scale(1.0))])
    assert seen == [2] and [r.label for r in history.interventions] == ["relu_1_2", "linear_2_3"]


def test_an_intervention_error_is_raised_even_with_on_error_return() -> None:
    model, x = _net()
    with pytest.raises(InterventionError, match="returned shape"):
        torchlog.log_forward_pass(model, x, on_error="return", intervene={"1": lambda v, f: v[0]})


def test_a_log_file_records_the_interventions_as_data_and_marks_the_passes(tmp_path) -> None:
    pytest.importorskip("h5py")
    model, x = _net()
    path = str(tmp_path / "acted.h5")
    history = torchlog.log_forward_pass(model, x, save_to=path, intervene={"1": add(torch.ones(5), alpha=2.0)})
    loaded = torchlog.load(path)
    (record,) = loaded.interventions
    assert (record.site, record.label, record.action) == ("1", "relu_1_2", "add(vector=<tensor (5,) float32>, alpha=2.0, dim=-1)")
    assert record.max_abs_change == pytest.approx(history.interventions[0].max_abs_change)
    assert record.before == history.interventions[0].before and record.before["numel"] == 15
    (mark,) = loaded["relu_1_2"].extra["interventions"]
    assert mark["action_name"] == "add" and mark["params"]["alpha"] == 2.0
    assert torch.equal(loaded["relu_1_2"].tensor_contents, history["relu_1_2"].tensor_contents)
    assert "Interventions: 1 fired" in str(loaded) and "Intervened: add(" in str(loaded["relu_1_2"])
    with open(path, "rb") as f:
        assert b"pickle" not in f.read()


def test_intervened_passes_are_drawn_in_their_own_style_and_name_the_action(tmp_path) -> None:
    import json

    from torchlog.vis.style import LEGEND_TEXT, NODE_STYLES, kind_of
    from torchlog.vis.viewer.data import page_data

    model, x = _net()
    history = torchlog.log_forward_pass(model, x, intervene={"relu_1_2": scale(0.5)})
    assert kind_of(history["relu_1_2"]) == "intervened" and kind_of(history["linear_1_1"]) != "intervened"
    assert NODE_STYLES["intervened"]["shape"] == "hexagon" and "intervened" in LEGEND_TEXT
    data = page_data(history, "unrolled", None)
    entry = next(p for p in data["passes"] if p["label"] == "relu_1_2")
    assert entry["kind"] == "intervened" and "intervened: scale(k=0.5)" in entry["lines"]
    assert entry["interventions"][0].startswith("scale(k=0.5) at site 'relu_1_2', max |change| ")
    assert "intervened" in data["dot"]["kinds"]
    page = history.to_html(str(tmp_path / "acted.html"))
    assert json.dumps("intervened: scale(k=0.5)") in open(page, encoding="utf-8").read()


def test_a_replacement_of_the_wrong_shape_names_the_site_the_op_and_the_pass_label() -> None:
    class Loop(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            for _ in range(3):
                x = self.fc(x)
            return x

    for site in ("fc:2", "linear_1_1:2", select.module("fc", 2)):
        with pytest.raises(InterventionError) as caught:
            torchlog.log_forward_pass(Loop(), torch.ones(1, 3), intervene={site: torch.zeros(2, 2)})
        text = str(caught.value)
        assert f"site {site!r}" in text and "at op 2 ('linear'" in text and "pass 'linear_1_1:2'" in text, text
