"""Proof by difference: every executor honours every field of the plan, or refuses it by name.

The plan's fields (capture/plan.py's OpPlan) are what to save, what to act on, where to stop
and what to watch (`stop_on`). The executors are the recorder (`log_forward_pass`), the lean
capture and module hooks (`torchlog.run`, `run_lean`), counterfactual replay, patched runs
(`run_patched`, through module hooks or the lean capture, with the prefix cache sweeps use)
and `find_nonfinite`. They run on models whose key op is an `out=` op, an in-place op,
`t.data = v`, a write through a view, `t[i] = v`, a module returning a tuple, an LSTM or a
loop (tests/plan_models.py), on the seed's SimpleRecurrent and on GPT-2, and every result is
checked in plain PyTorch: the model's own code making the edit after the key op, forward
hooks and pre-hooks, or a TorchFunctionMode editing the n-th call of a function. Where an
executor cannot honour a field it must raise an InterventionError saying which, before the
model runs: never a silent wrong number.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import torchlog
from tests.models import SimpleRecurrent
from tests.plan_models import STEPS, WIDTH, Calls, Composed, EditCalls, hooked_output, key_passes, make, oracle_output
from torchlog import select
from torchlog.capture import CaptureOptions, run_captured
from torchlog.capture.lean import run_lean
from torchlog.capture.plan import Act, ExitRule, OpPlan, OpRule
from torchlog.errors import InterventionError, InvalidOptionError
from torchlog.history import ModelHistory, all_passes
from torchlog.interventions import add, clamp, scale, zero_ablate
from torchlog.patching.prefix import Prefix
from torchlog.patching.runs import Edit, run_patched
from torchlog.patching.sweep_setup import find_targets
from torchlog.records import PassRecord
from torchlog.replay import replay
from torchlog.sites.probes import PROBES
from torchlog.sites.resolve import call_positions

INDEX = 1  # the step under test, between two Linear steps
STEP = f"steps.{INDEX}"
VECTOR = torch.linspace(-1.0, 1.0, WIDTH)
# Each spelling gets its own action: (torchlog's action, the same edit in plain PyTorch).
ACTIONS = {
    "label": (scale(-3.0), lambda t: t * -3.0),
    "position": (add(VECTOR), lambda t: t + VECTOR),
    "func": (clamp(-0.3, 0.3), lambda t: t.clamp(-0.3, 0.3)),
    "module": (zero_ablate(), torch.zeros_like),
}
OTHER_ACTION = (scale(2.5), lambda t: t * 2.5)
# Module spellings: the site, and where a hook makes the same edit (address, call, output,
# on_input). Patched runs edit every pass a site names, as a sweep's rows do: every tensor a
# module returns (PATCHED_OUTPUTS), where `intervene` edits the first.
MODULE_SITES: dict[str, tuple[Any, tuple[str, int | None, int, bool]]] = {
    "module": (STEP, (STEP, None, 0, False)),
    "module input": (select.module_input(STEP), (STEP, None, 0, True)),
    "output 1 of a tuple": (select.module(f"{STEP}.pair", output=1), (f"{STEP}.pair", None, 1, False)),
    "a tuple's module": (f"{STEP}.pair", (f"{STEP}.pair", None, 0, False)),
    "h_n of an LSTM": (select.module(f"{STEP}.lstm", output=1), (f"{STEP}.lstm", None, 1, False)),
    "an LSTM's module": (f"{STEP}.lstm", (f"{STEP}.lstm", None, 0, False)),
    "a module call in a loop": (f"{STEP}.fc:2", (f"{STEP}.fc", 2, 0, False)),
    "every call in a loop": (f"{STEP}.fc", (f"{STEP}.fc", None, 0, False)),
}
PATCHED_OUTPUTS = {"a tuple's module": (0, 1), "an LSTM's module": (0, 1, 2)}
EXTRA = {"tuple": ("output 1 of a tuple", "a tuple's module"), "lstm": ("h_n of an LSTM", "an LSTM's module"),
         "loop": ("a module call in a loop", "every call in a loop")}
COMMON = ("label", "position", "func", "module", "module input")
CASES = [(kind, spelling) for kind in STEPS for spelling in COMMON + EXTRA.get(kind, ())]
ACT_EXECUTORS = ("recorder", "lean", "replay", "patched", "patched lean")
# (Patched runs and module inputs: one test of their own below, not one per model.)
ACT_CASES = [(kind, spelling, executor) for kind, spelling in CASES for executor in ACT_EXECUTORS
             if not (executor.startswith("patched") and spelling == "module input")]
# Where an executor refuses a site: (executor, kind or None for every kind, spelling) -> what it says.
REFUSED = {("replay", None, "module input"): "what a module receives",
           **{("replay", "view write", spelling): "a view after an in-place write"
              for spelling in ("label", "position", "func")}}

Oracle = Callable[[Composed, torch.Tensor, Callable], torch.Tensor]


def _model(kind: str) -> tuple[Composed, torch.Tensor]:
    return make(["linear", kind, "linear"])


def _logged(model: Composed, x: torch.Tensor, **keywords: Any) -> ModelHistory:
    with torch.no_grad():
        return torchlog.log_forward_pass(model, x, **keywords)


def _site(model: Composed, kind: str, spelling: str, plain: ModelHistory,
          patched: bool = False) -> tuple[Any, Oracle]:
    """The site a spelling names in a model of `kind`, and its plain-PyTorch oracle (for a
    patched run with `patched`)."""
    number = 2 if kind == "loop" else 1  # in the loop, its second pass: found on a probe
    key = key_passes(plain, model, INDEX)[number - 1]
    if spelling in ("label", "position"):
        site = key.label if spelling == "label" else key.op_index
        return site, lambda m, x, edit: oracle_output(m, x, INDEX, edit, number)
    if spelling == "func":  # every pass of the key op
        site = select.func(STEPS[kind].key_func) & select.in_module(STEP)
        return site, lambda m, x, edit: oracle_output(m, x, INDEX, edit)
    site, (address, call, output, on_input) = MODULE_SITES[spelling]
    outputs = PATCHED_OUTPUTS.get(spelling, output) if patched else output
    return site, lambda m, x, edit: hooked_output(m, x, address, edit, call, outputs, on_input)


def _expected(model: Composed, x: torch.Tensor, oracle: Oracle, edit: Callable) -> tuple[torch.Tensor, list]:
    """The oracle's output, and every step's key-op values in that run."""
    model.reset_taps()
    model.keep_values(True)
    try:
        output = oracle(model, x, edit)
        return output, [list(step.seen) for step in model.steps]
    finally:
        model.keep_values(False)
        model.reset_taps()


def _acted(executor: str, model: Composed, x: torch.Tensor, site: Any, action: Any) -> tuple[torch.Tensor, Any]:
    """The model's output with `site` acted on by `executor`, and the history it made (or None)."""
    with torch.no_grad():
        if executor == "recorder":
            history = torchlog.log_forward_pass(model, x, intervene={site: action})
            return history[-1].tensor_contents, history
        if executor == "lean":
            return torchlog.run(model, x, intervene={site: action}).output, None
        if executor == "replay":
            new = replay(torchlog.log_forward_pass(model, x, save_function_args=True), {site: action})
            return new[-1].tensor_contents, new
        return _patched(model, x, site, action, lean=executor == "patched lean"), None


def _patched(model: Composed, x: torch.Tensor, site: Any, action: Any, lean: bool) -> torch.Tensor:
    """Two patched runs sharing a prefix cache: the first records its calls up to the edit,
    the second is served them. Both must give the same output (returned)."""
    history = torchlog.log_forward_pass(model, x, layers_to_save=None)
    edits = [Edit(target, lambda v: action(v, None)) for target in find_targets(history, [site])]
    prefix, named = Prefix(), dict(model.named_modules())
    first = run_patched(model, (x,), {}, edits, named, prefix=prefix, calls=[] if lean else None)
    second = run_patched(model, (x,), {}, edits, named, prefix=prefix, calls=[] if lean else None)
    assert prefix.num_served > 0 or edits[0].target.call[0] == 1, "the second run was served nothing"
    alone = run_patched(model, (x,), {}, edits, named, calls=[] if lean else None)
    torch.testing.assert_close(first, alone, rtol=0, atol=0, msg="a recording run differs from a plain one")
    torch.testing.assert_close(second, alone, rtol=0, atol=0, msg="a served run differs from a plain one")
    return alone


def _refusal(executor: str, kind: str, spelling: str) -> str | None:
    return REFUSED.get((executor, None, spelling), REFUSED.get((executor, kind, spelling)))


@pytest.mark.parametrize(("kind", "spelling", "executor"), ACT_CASES)
def test_every_executor_acts_where_the_models_own_code_would(kind: str, spelling: str, executor: str) -> None:
    model, x = _model(kind)
    site, oracle = _site(model, kind, spelling, _logged(model, x), patched=executor.startswith("patched"))
    action, edit = ACTIONS.get(spelling, OTHER_ACTION)
    refused = _refusal(executor, kind, spelling)
    if refused is not None:
        with pytest.raises(InterventionError, match=refused):
            _acted(executor, model, x, site, action)
        return
    want, values = _expected(model, x, oracle, edit)
    assert not torch.allclose(want, oracle_output(model, x)), "the edit must change the output"
    got, history = _acted(executor, model, x, site, action)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    if history is not None:  # what it saved downstream of the edit is what the edited model computed
        for step, expected in enumerate(values):
            saved = [p.tensor_contents for p in key_passes(history, model, step)]
            assert len(saved) == len(expected), (step, len(saved))
            for value, wanted in zip(saved, expected):
                torch.testing.assert_close(value, wanted, rtol=1e-5, atol=1e-6)


def test_patching_refuses_a_module_input_saying_why() -> None:
    model, x = _model("linear")
    site = select.module_input(STEP)
    with pytest.raises(InterventionError) as refused:
        _patched(model, x, site, scale(2.0), lean=False)
    words = str(refused.value).replace(repr(site), "")  # the site's repr alone says `module_input`
    assert any(text in words for text in ("receives", "module input", "module's input")), words


# ----- save ---------------------------------------------------------------------------------
SAVES = [(kind, spelling) for kind, spelling in CASES if spelling not in ("module input", "every call in a loop")]


def _chosen(model: Composed, x: torch.Tensor, kind: str, spelling: str,
            plain: ModelHistory) -> tuple[Any, list[torch.Tensor], list[PassRecord]]:
    """A save site, and the passes of `plain` it names whose values plain PyTorch sees (by
    taps or hooks), with those values. A module address names every tensor the module
    returns (as in patched runs); `func` also names a view's value after a write, which no
    tap sees (the caller checks that it is saved too)."""
    site, oracle = _site(model, kind, spelling, plain, patched=True)
    if spelling in ("label", "position", "func"):
        keys = key_passes(plain, model, INDEX)
        chosen = keys if spelling == "func" else [keys[(2 if kind == "loop" else 1) - 1]]
        values = _expected(model, x, lambda m, y, edit: oracle_output(m, y), None)[1][INDEX]
        return site, [values[keys.index(p)] for p in chosen], chosen
    seen: list[torch.Tensor] = []
    oracle(model, x, lambda t: seen.append(t.detach().clone()) or t)
    _, (address, call, output, _) = MODULE_SITES[spelling]
    outputs = PATCHED_OUTPUTS.get(spelling, (output,))
    calls = plain.modules[address].call_outputs
    labels = [returned[k] for number, returned in enumerate(calls, 1) if call in (None, number) for k in outputs]
    return site, seen, [plain[label] for label in labels]


@pytest.mark.parametrize(("kind", "spelling"), SAVES)
def test_the_recorder_saves_what_plain_pytorch_sees_there(kind: str, spelling: str) -> None:
    model, x = _model(kind)
    plain = _logged(model, x)
    site, values, chosen = _chosen(model, x, kind, spelling, plain)
    history = _logged(model, x, layers_to_save=[site])
    expected = [p.label for p in chosen]
    if spelling == "func":  # also the view's value after the write, which is a `mul_` pass too
        expected = sorted(expected + [p.label for p in all_passes(plain) if "view_written_by" in p.extra
                                      and p.layer_type == model.steps[INDEX].key_func],
                          key=lambda label: plain[label].op_index)
    assert [p.label for p in history.passes] == expected
    assert len(values) == len(chosen)
    for record, value in zip(chosen, values):
        torch.testing.assert_close(history[record.label].tensor_contents, value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("kind", "spelling"), SAVES)
def test_the_lean_capture_saves_by_call_what_plain_pytorch_sees_there(kind: str, spelling: str) -> None:
    model, x = _model(kind)
    plain = _logged(model, x)
    _, values, chosen = _chosen(model, x, kind, spelling, plain)
    positions = call_positions(all_passes(plain))
    wanted: dict[int, tuple[int, ...]] = {}
    for record in chosen:
        call, output = positions[record.op_index]
        wanted[call] = wanted.get(call, ()) + (output,)
    with torch.no_grad():
        seen = run_lean(model, (x.clone(),), {}, wanted)
    for record, value in zip(chosen, values):
        torch.testing.assert_close(seen.saved[positions[record.op_index]], value, rtol=1e-5, atol=1e-6)


def test_a_module_input_is_no_pass_to_save() -> None:
    model, x = _model("linear")
    with pytest.raises(InvalidOptionError, match="receives"):
        _logged(model, x, layers_to_save=[select.module_input(STEP)])


# ----- stop ---------------------------------------------------------------------------------
# Decided while the pass runs: nothing after the stop runs, probe included. A whole layer's
# label and a position are found on a probe, which may run the model once more (only once).
STOPS = ("module", "module call", "label pass", "label", "position")
STRICT = ("module", "module call", "label pass", "inner module call")
STOP_CASES = [(kind, spelling) for kind in STEPS for spelling in STOPS] + [("loop", "inner module call")]


def _stop(model: Composed, kind: str, spelling: str, plain: ModelHistory) -> tuple[Any, str]:
    """The stop_after site of a spelling and the label of the pass the stopped history ends with."""
    keys = key_passes(plain, model, INDEX)
    if spelling in ("module", "module call"):
        return (STEP if spelling == "module" else f"{STEP}:1"), plain.modules[STEP].call_outputs[0][-1]
    if spelling == "inner module call":
        return f"{STEP}.fc:2", plain.modules[f"{STEP}.fc"].call_outputs[1][-1]
    key = keys[1] if kind == "loop" else keys[0]  # the loop's second pass
    if spelling == "label pass":
        return (key.label if ":" in key.label else f"{key.label}:1"), key.label
    if spelling == "label":  # the whole layer: it stops after its last pass
        return key.label.partition(":")[0], keys[-1].label
    return key.op_index, key.label


@pytest.mark.parametrize("executor", ["recorder", "lean"])
@pytest.mark.parametrize(("kind", "spelling"), STOP_CASES)
def test_a_stop_ends_the_pass_there_and_nothing_after_it_runs(kind: str, spelling: str, executor: str) -> None:
    model, x = _model(kind)
    plain = _logged(model, x)
    site, last = _stop(model, kind, spelling, plain)
    PROBES.drop_model(model)
    with Calls(model) as counts, torch.no_grad():
        if executor == "recorder":
            history = torchlog.log_forward_pass(model, x, stop_after=site)
        else:
            result = torchlog.run(model, x, stop_after=site)
    later = counts.get(f"steps.{INDEX + 1}", 0)
    assert later == 0 if spelling in STRICT and not (kind == "loop" and spelling == "label pass") else later <= 1, \
        f"steps.{INDEX + 1} ran {later} times after stop_after={site!r}"
    if spelling == "inner module call":
        assert counts[f"{STEP}.fc"] == 2
    if executor == "lean":
        assert result.stopped and result.output is None
        return
    assert history.stopped_at == last
    values = _expected(model, x, lambda m, y, edit: oracle_output(m, y), None)[1]
    for step in range(INDEX + 1):  # every key value saved before the stop is the plain one
        for record, value in zip(key_passes(history, model, step), values[step]):
            torch.testing.assert_close(record.tensor_contents, value, rtol=1e-5, atol=1e-6)


# ----- watch (stop_on) ----------------------------------------------------------------------
def _nonfinite(t: torch.Tensor) -> bool:
    return t.is_floating_point() and not bool(torch.isfinite(t).all())


def _nan_key_plan(model: Composed) -> OpPlan:
    """Write NaN at step INDEX's key op, and stop at the first op with a non-finite output."""
    test = select.func(model.steps[INDEX].key_func) & select.in_module(STEP)
    nan = Act(0, "nan", lambda value, firing: torch.full_like(value, float("nan")))
    return OpPlan(at_ops=(OpRule(test.op_test({}), nan, uses_position=False),), stop_on=_nonfinite)


@pytest.mark.parametrize("executor", ["recorder", "lean"])
@pytest.mark.parametrize("kind", [kind for kind in STEPS if kind != "loop"])
def test_a_watch_stops_at_the_op_that_made_the_first_nan(kind: str, executor: str) -> None:
    model, x = _model(kind)
    plain = _logged(model, x)
    (key,) = key_passes(plain, model, INDEX)
    model.reset_taps()
    with Calls(model) as counts, torch.no_grad():
        if executor == "recorder":
            captured = run_captured(model, (x.clone(),), {}, CaptureOptions(plan=_nan_key_plan(model)))
            assert captured.failure is None and captured.stopped_at == key.op_index
        else:
            assert run_lean(model, (x.clone(),), {}, {}, plan=_nan_key_plan(model)).stopped
    # The code after the key op (its tap) never ran, nor anything after the step.
    assert model.steps[INDEX].num_taps == 0 and counts.get(f"steps.{INDEX + 1}", 0) == 0


@pytest.mark.parametrize("kind", sorted(STEPS))
def test_find_nonfinite_names_the_first_nan_and_runs_nothing_after_it(kind: str) -> None:
    model, x = make(["linear", kind, "linear", "linear"])
    with torch.no_grad():
        model.steps[2].fc.bias[1] = float("nan")
    want = _expected(model, x, lambda m, y, edit: oracle_output(m, y), None)[1][2][0]
    with Calls(model) as counts, torch.no_grad():
        found = torchlog.find_nonfinite(model, x)
    assert found.func_name == "linear" and "steps.2.fc:1" in found.containing_modules
    torch.testing.assert_close(found.tensor_contents, want, equal_nan=True)
    assert counts.get("steps.3", 0) == 0
    with Calls(model) as counts, torch.no_grad():
        assert run_lean(model, (x,), {}, {}, plan=OpPlan(stop_on=_nonfinite)).stopped
    assert counts.get("steps.3", 0) == 0 and counts["steps.2.fc"] == 1


# ----- refusals -----------------------------------------------------------------------------
def _act(site: Any = "site") -> Act:
    return Act(0, site, scale(2.0))


LEAN_REFUSALS = {
    "save_exits": OpPlan(save_exits={STEP: ()}),
    "save_ops": OpPlan(save_ops=(lambda op: True,)),
    "at_nodes": OpPlan(at_nodes={2: ("linear", (_act(),))}),
    "stop_node": OpPlan(stop_node=2),
    "at_ops": OpPlan(at_ops=(OpRule(lambda op: op.op_index == 2, _act()),)),
    "at_exits": OpPlan(at_exits={STEP: (ExitRule(None, lambda op: True, _act()),)}),
}


@pytest.mark.parametrize("field", sorted(LEAN_REFUSALS))
def test_the_lean_capture_refuses_a_field_it_cannot_honour_by_name_before_the_model_runs(field: str) -> None:
    model, x = _model("linear")
    with Calls(model) as counts, pytest.raises(InterventionError, match=field):
        run_lean(model, (x,), {}, {}, plan=LEAN_REFUSALS[field])
    assert counts == {}


@pytest.mark.parametrize(("site", "field"), [
    (select.where(lambda op: op.op_index == 2), "at_ops"),
    (select.module(STEP) & select.func("tanh"), "at_exits"),
])
def test_torchlog_run_refuses_what_only_a_log_can_do_by_name_before_the_model_runs(site: Any, field: str) -> None:
    model, x = _model("linear")
    with Calls(model) as counts, pytest.raises(InterventionError, match=field):
        torchlog.run(model, x, intervene={site: scale(2.0)})
    assert counts == {}
    # The recorder honours the same site.
    with torch.no_grad():
        assert torchlog.log_forward_pass(model, x, intervene={site: scale(2.0)}).interventions


# ----- the seed's SimpleRecurrent: one Linear four times, with + 1 and * 2 ----------------------
class EditedRecurrent(SimpleRecurrent):
    """SimpleRecurrent's forward with the edit written in after op `op` of the passes `passes`
    (None: every pass)."""

    def __init__(self, op: str, passes: set[int] | None, edit: Callable) -> None:
        super().__init__()
        self.op, self.passes, self.edit = op, passes, edit

    def _edited(self, x: torch.Tensor, op: str, number: int) -> torch.Tensor:
        return self.edit(x) if op == self.op and (self.passes is None or number in self.passes) else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for number in range(1, 5):
            x = self._edited(self.fc(x), "linear", number)
            x = self._edited(x + 1, "add", number)
            x = self._edited(x * 2, "mul", number)
        return x


def _recurrent_site(model: SimpleRecurrent, spelling: str, plain: ModelHistory) -> tuple[Any, Oracle]:
    """A site of SimpleRecurrent and its oracle: a hook, or the edit written into its forward."""
    def written(op: str, passes: set[int] | None) -> Oracle:
        def oracle(m: nn.Module, x: torch.Tensor, edit: Callable) -> torch.Tensor:
            copy = EditedRecurrent(op, passes, edit)
            copy.load_state_dict(m.state_dict())
            with torch.no_grad():
                return copy(x)
        return oracle

    adds = [p for p in all_passes(plain) if p.layer_type == "add"]
    linears = [p for p in all_passes(plain) if p.func_name == "linear"]
    return {
        "a module call": ("fc:3", lambda m, x, edit: hooked_output(m, x, "fc", edit, 3)),
        "every call": ("fc", lambda m, x, edit: hooked_output(m, x, "fc", edit)),
        "a label's pass": (adds[1].label, written("add", {2})),
        "func": (select.func("mul"), written("mul", None)),
        "position": (linears[3].op_index, written("linear", {4})),
    }[spelling]


@pytest.mark.parametrize("executor", ACT_EXECUTORS)
@pytest.mark.parametrize("spelling", ["a module call", "every call", "a label's pass", "func", "position"])
def test_simple_recurrent_is_acted_on_where_its_own_code_would(spelling: str, executor: str) -> None:
    torch.manual_seed(0)
    model, x = SimpleRecurrent().eval(), torch.randn(2, 5)
    site, oracle = _recurrent_site(model, spelling, _logged(model, x))
    want = oracle(model, x, lambda t: t * -0.5)
    with torch.no_grad():
        assert not torch.allclose(want, model(x))
    got, _ = _acted(executor, model, x, site, scale(-0.5))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("executor", ["recorder", "lean"])
def test_simple_recurrent_saves_and_stops_at_a_module_call(executor: str) -> None:
    torch.manual_seed(0)
    model, x = SimpleRecurrent().eval(), torch.randn(2, 5)
    seen: list[torch.Tensor] = []  # what a forward hook sees at each call of fc
    hooked_output(model, x, "fc", lambda t: seen.append(t.clone()) or t)
    if executor == "recorder":
        with Calls(model) as counts, torch.no_grad():
            history = torchlog.log_forward_pass(model, x, layers_to_save=["fc"], stop_after="fc:2")
        saved = [p.tensor_contents for p in history.passes]
    else:
        with Calls(model) as counts, torch.no_grad():
            assert torchlog.run(model, x, stop_after="fc:2").stopped
        assert counts["fc"] == 2
        positions = call_positions(all_passes(_logged(model, x, layers_to_save=None)))
        calls = [positions[p.op_index][0] for p in all_passes(_logged(model, x)) if p.func_name == "linear"]
        with Calls(model) as counts, torch.no_grad():
            lean = run_lean(model, (x,), {}, {call: (0,) for call in calls}, stop_call=calls[1])
        assert lean.stopped
        saved = [lean.saved[(call, 0)] for call in calls if (call, 0) in lean.saved]
    assert counts["fc"] == 2 and len(saved) == 2
    for value, want in zip(saved, seen):
        torch.testing.assert_close(value, want, rtol=1e-5, atol=1e-6)


# ----- GPT-2 --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt2() -> tuple[nn.Module, torch.Tensor]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32, use_cache=False,
                                     bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    return transformers.GPT2LMHeadModel(config).eval(), torch.randint(0, 100, (1, 8))


def _softmax_edited(calls: set[int] | None) -> Oracle:
    def oracle(m: nn.Module, x: torch.Tensor, edit: Callable) -> Any:
        with torch.no_grad(), EditCalls(nn.functional.softmax, calls, edit):
            return m(x)
    return oracle


def _gpt2_site(spelling: str, plain: ModelHistory) -> tuple[Any, Oracle]:
    first_softmax = next(p.label for p in plain.passes if p.func_name == "softmax")
    return {
        "a block": ("transformer.h.1", lambda m, x, edit: hooked_output(m, x, "transformer.h.1", edit)),
        "a block's input": (select.module_input("transformer.h.1"),
                            lambda m, x, edit: hooked_output(m, x, "transformer.h.1", edit, on_input=True)),
        "a label": (first_softmax, _softmax_edited({1})),
        "func in a module": (select.func("softmax") & select.in_module("transformer.h.1"), _softmax_edited({2})),
    }[spelling]


def _logits(value: Any) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else value.logits


@pytest.mark.heavy
@pytest.mark.parametrize("executor", ACT_EXECUTORS)
@pytest.mark.parametrize("spelling", ["a block", "a block's input", "a label", "func in a module"])
def test_gpt2_is_acted_on_where_hooks_and_its_own_calls_would(gpt2, spelling: str, executor: str) -> None:
    model, ids = gpt2
    site, oracle = _gpt2_site(spelling, _logged(model, ids))
    if spelling == "a block's input" and executor != "recorder" and executor != "lean":
        with pytest.raises(InterventionError):  # replay and patching act on passes, not on inputs
            _acted(executor, model, ids, site, scale(0.5))
        return
    want = _logits(oracle(model, ids, lambda t: t * 0.5))
    with torch.no_grad():
        assert not torch.allclose(want, model(ids).logits)
    got, _ = _acted(executor, model, ids, site, scale(0.5))
    torch.testing.assert_close(_logits(got), want, rtol=1e-5, atol=1e-5)


@pytest.mark.heavy
def test_gpt2_saves_what_hooks_and_its_own_calls_see(gpt2) -> None:
    model, ids = gpt2
    blocks: list[torch.Tensor] = []
    hooked_output(model, ids, "transformer.h.0", lambda t: blocks.append(t.clone()) or t)
    softmaxes: list[torch.Tensor] = []
    _softmax_edited(None)(model, ids, lambda t: softmaxes.append(t.clone()) or t)
    history = _logged(model, ids, layers_to_save=["transformer.h.0", select.func("softmax")])
    saved = [p.tensor_contents for p in history.passes if p.func_name == "softmax"]
    assert len(saved) == len(softmaxes) == 2
    for value, want in zip(saved, softmaxes):
        torch.testing.assert_close(value, want, rtol=1e-5, atol=1e-6)
    block = history[history.modules["transformer.h.0"].call_outputs[0][0]].tensor_contents
    torch.testing.assert_close(block, blocks[0], rtol=1e-5, atol=1e-6)
    plain = _logged(model, ids, layers_to_save=None)
    positions = call_positions(all_passes(plain))
    chosen = [p for p in all_passes(plain) if p.func_name == "softmax"]
    with torch.no_grad():
        lean = run_lean(model, (ids,), {}, {positions[p.op_index][0]: (0,) for p in chosen})
    for record, want in zip(chosen, softmaxes):
        torch.testing.assert_close(lean.saved[positions[record.op_index]], want, rtol=1e-5, atol=1e-6)


@pytest.mark.heavy
@pytest.mark.parametrize("executor", ["recorder", "lean"])
def test_gpt2_stops_after_a_block_and_runs_nothing_after_it(gpt2, executor: str) -> None:
    model, ids = gpt2
    PROBES.drop_model(model)
    with Calls(model) as counts, torch.no_grad():
        if executor == "recorder":
            history = torchlog.log_forward_pass(model, ids, stop_after="transformer.h.0")
            assert history.stopped_at == history.modules["transformer.h.0"].call_outputs[0][-1]
        else:
            assert torchlog.run(model, ids, stop_after="transformer.h.0").stopped
    assert counts[""] == 1 and counts["transformer.h.0"] == 1
    assert "transformer.h.1" not in counts and "lm_head" not in counts


@pytest.mark.heavy
@pytest.mark.parametrize("executor", ["recorder", "lean"])
def test_gpt2_watch_stops_at_the_first_nan_an_input_edit_makes(gpt2, executor: str) -> None:
    model, ids = gpt2
    nan = Act(0, "nan", lambda value, firing: torch.full_like(value, float("nan")))
    plan = OpPlan(at_entries={"transformer.h.1": (ExitRule(None, None, nan),)}, stop_on=_nonfinite)
    with Calls(model) as counts, torch.no_grad():
        if executor == "recorder":
            captured = run_captured(model, (ids,), {}, CaptureOptions(plan=plan))
            assert captured.failure is None and captured.stopped_at is not None
        else:
            assert run_lean(model, (ids,), {}, {}, plan=plan).stopped
    # The first op reading the NaN input is the block's first layer norm: nothing after it runs.
    assert counts["transformer.h.1.ln_1"] == 1
    assert "transformer.h.1.attn" not in counts and "lm_head" not in counts
