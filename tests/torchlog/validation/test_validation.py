"""Replay validation: every saved activation is re-computed from its parents' saved values."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlog
from tests.models import TINY_MODELS, AlexNet, SimpleRecurrent
from tests.torchlog.test_real_models import TORCH_CASES, TRANSFORMERS
from torchlog.records import ParentEdge
from torchlog.validation import find_replay_problems, validate_saved_activations


def _log(model: nn.Module, x: torch.Tensor, **options) -> torchlog.ModelHistory:
    return torchlog.log_forward_pass(model, x, save_function_args=True, detach_saved_tensors=True,
                                     random_seed=0, **options)


# ----- passes on real models ------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_tiny_models_validate(name: str, capsys) -> None:
    make_model, make_input = TINY_MODELS[name]
    torch.manual_seed(0)
    assert validate_saved_activations(make_model(), make_input(), random_seed=1, verbose=True), \
        capsys.readouterr().out


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_alexnet_small_input_validates(training: bool, capsys) -> None:
    torch.manual_seed(0)
    model = AlexNet(num_classes=10).train(training)
    assert validate_saved_activations(model, torch.randn(1, 3, 64, 64), random_seed=2, verbose=True), \
        capsys.readouterr().out


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", sorted(TORCH_CASES))
def test_torch_nn_models_validate(name: str, training: bool, capsys) -> None:
    make_model, make_args = TORCH_CASES[name]
    torch.manual_seed(0)
    model = make_model().train(training)
    assert validate_saved_activations(model, list(make_args()), random_seed=3, verbose=True), \
        capsys.readouterr().out


@pytest.mark.heavy
@pytest.mark.parametrize("name", sorted(TRANSFORMERS))
def test_transformers_models_validate(name: str, capsys) -> None:
    torch.manual_seed(0)
    model, kwargs = TRANSFORMERS[name]()
    assert validate_saved_activations(model.eval(), (), kwargs, random_seed=0, verbose=True), \
        capsys.readouterr().out


@pytest.mark.heavy
def test_transformers_dropout_validates(capsys) -> None:
    """Training mode: every dropout replays from its recorded RNG state."""
    torch.manual_seed(0)
    model, kwargs = TRANSFORMERS["bert"]()
    assert validate_saved_activations(model.train(), (), kwargs, random_seed=5, verbose=True), \
        capsys.readouterr().out


# ----- the careful cases, each in a tiny model --------------------------------------------------
class _Case(nn.Module):
    """A Linear followed by one tricky pattern."""

    def __init__(self, pattern) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.pattern = pattern

    def forward(self, x):
        return self.pattern(self.lin(x), x)


def _inplace_on_slice(y, x):  # getitem, __iadd__ on the view, setitem back
    y[:, 0] += 1
    return y * 2


def _setitem_pieces(y, x):  # __setitem__ from a computed slice, a constant, another tensor
    z = torch.zeros(4, 4)
    z[1:3] = y[:2]
    z[0] = 7
    z[:, 1] = x[:, 0]
    return z


def _same_parent_twice(y, x):  # one parent in two slots, and in a list
    return torch.stack([y, y, x]).sum(0) + y * y


def _multi_output(y, x):  # output_index: unbind, chunk, sort's values and indices
    values, indices = torch.sort(y, dim=1)
    return torch.cat(y.unbind(0)).sum() + torch.chunk(y, 2, 1)[1].sum() + values * indices


def _integer_ops(y, x):  # ops on integer tensors, an index used by gather
    idx = torch.argsort(y, dim=1)
    shifted = (idx * 3 + 1) % 4
    return torch.gather(y, 1, shifted) + idx.float()


def _python_args(y, x):  # non-tensor arguments: ints, floats, None, a dim tuple
    return torch.clamp(y, min=0.1, max=None).pow(2).sum(dim=(0,), keepdim=True) + F.pad(y, (1, 1))[:, 1:-1]


def _masks_and_selects(y, x):  # where/masked_fill whose condition selects nothing of a parent
    never = y > 1e6
    return y.masked_fill(never, 0.0) + torch.where(never, x, torch.zeros_like(y)) + (y > 0).float()


def _dropout_inplace_relu(y, x):  # random ops (RNG state) and in-place activations
    y = F.relu_(y * 1)
    return F.dropout(y, 0.5, training=True) + torch.rand_like(y)


def _view_written(y, x):  # a whole tensor changed through a flat view of it
    v = y.view(-1)
    v.mul_(2)
    return y + 1


def _base_written_after_view_read(y, x):  # a row view read after its base was changed
    row = y[0]
    y.add_(1)
    return row * 2


CASES = {
    "inplace_on_slice": _inplace_on_slice,
    "setitem_pieces": _setitem_pieces,
    "same_parent_twice": _same_parent_twice,
    "multi_output": _multi_output,
    "integer_ops": _integer_ops,
    "python_args": _python_args,
    "masks_and_selects": _masks_and_selects,
    "dropout_inplace_relu": _dropout_inplace_relu,
    "view_written": _view_written,
    "base_written_after_view_read": _base_written_after_view_read,
}


@pytest.mark.parametrize("pattern", list(CASES.values()), ids=list(CASES))
def test_careful_cases_validate(pattern, capsys) -> None:
    torch.manual_seed(0)
    assert validate_saved_activations(_Case(pattern), torch.randn(4, 4), random_seed=4, verbose=True), \
        capsys.readouterr().out


# ----- failures are caught ----------------------------------------------------------------------
def _middle_op(history: torchlog.ModelHistory, layer_type: str, pass_num: int = 1):
    return next(p for p in history if p.layer_type == layer_type and p.pass_num == pass_num)


def test_corrupted_saved_activation_is_caught() -> None:
    torch.manual_seed(0)
    history = _log(SimpleRecurrent(), torch.rand(6, 5))
    assert not find_replay_problems(history).problems
    target = _middle_op(history, "add", 2)
    target.saved = target.saved + 1
    problems = find_replay_problems(history).problems
    own = [p for p in problems if p.label == target.label]
    assert [p.check for p in own] == ["replay"]
    assert own[0].max_diff == pytest.approx(1.0)
    # Its child, re-run on the corrupted value, no longer matches either.
    assert {p.label for p in problems} == {target.label, *target.children}


def test_corrupted_parent_link_is_caught() -> None:
    torch.manual_seed(0)
    history = _log(SimpleRecurrent(), torch.rand(6, 5))
    target = _middle_op(history, "add", 2)
    wrong = _middle_op(history, "linear", 3)
    assert target.parents[0].label != wrong.label and target.shape == wrong.shape
    target.parents = (ParentEdge(wrong.label, target.parents[0].arg),) + target.parents[1:]
    problems = find_replay_problems(history).problems
    assert [(p.label, p.check) for p in problems] == [(target.label, "replay")]
    assert problems[0].max_diff > 0


def test_parent_the_op_ignores_is_caught() -> None:
    """An op whose output stays put whatever one parent holds fails the perturb check."""
    torch.manual_seed(0)
    history = _log(SimpleRecurrent(), torch.rand(6, 5))
    target = _middle_op(history, "mul", 2)
    saved = target.saved
    func, args, kwargs = target.func_args
    target.func_args = (lambda a, b: saved.clone(), args, kwargs)  # replays right, reads nothing
    problems = find_replay_problems(history).problems
    assert [(p.label, p.check) for p in problems] == [(target.label, "perturb")]
    assert target.parents[0].label in problems[0].detail


class _LogThenAdd(nn.Module):
    """`log(x - shift) + ones`: NaN where x < shift, -inf where x == shift."""

    def __init__(self, shift: float) -> None:
        super().__init__()
        self.shift = shift

    def forward(self, x):
        y = torch.log(x - self.shift)
        return y + torch.ones(y.shape)


def _add_edges(report) -> list[str]:
    return [e.detail for e in report.inconclusive if e.label.startswith("add")]


_INF = float("inf")


@pytest.mark.parametrize("shift, x", [
    (10.0, None),  # the reproducer: NaN throughout
    (0.0, torch.tensor([0.0, _INF, 0.0, _INF])),  # -inf and inf
    (0.0, torch.tensor([-1.0, 0.0, _INF, -2.0])),  # NaN, -inf, inf, NaN
], ids=["nan", "inf", "nan_and_inf"])
def test_output_nan_or_infinite_throughout_is_inconclusive_not_a_failure(shift, x) -> None:
    """No values of `ones` can move NaN + ones or inf + ones: the edge says nothing either way."""
    x = torch.rand(4) if x is None else x
    report = validate_saved_activations(_LogThenAdd(shift), x, random_seed=0, return_report=True)
    assert report.passed, report.problems
    assert [d for d in _add_edges(report) if "'ones_1_3'" in d and "NaN or infinite" in d]
    assert validate_saved_activations(_LogThenAdd(shift), x)


def test_output_nan_in_places_confirms_the_dependence_where_finite() -> None:
    x = torch.tensor([0.1, 0.9, 0.2, 0.7])  # log(x - 0.5): NaN, finite, NaN, finite
    history = _log(_LogThenAdd(0.5), x)
    add = _middle_op(history, "add")
    assert torch.isnan(add.saved).sum() == 2
    report = find_replay_problems(history)
    assert report.passed and _add_edges(report) == []  # both parents moved the finite elements
    finite = find_replay_problems(_log(_LogThenAdd(-1.0), x))  # log(x + 1): finite throughout
    assert report.num_perturbed == finite.num_perturbed > 0


def test_missing_dependence_next_to_nan_is_still_caught() -> None:
    """`add` replayed by a function that ignores `ones`: the finite elements stay put, a failure."""
    history = _log(_LogThenAdd(0.5), torch.tensor([0.1, 0.9, 0.2, 0.7]))
    add = _middle_op(history, "add")
    func, args, kwargs = add.func_args
    add.func_args = (lambda a, b: a + 1, args, kwargs)  # the same values, never reads b
    report = find_replay_problems(history)
    assert [(p.label, p.check) for p in report.problems] == [(add.label, "perturb")]
    assert "'ones_1_3'" in report.problems[0].detail and not report.passed


def test_verbose_names_layer_check_and_difference(capsys) -> None:
    class Drifting(nn.Module):
        """Returns a different value on every call: the logged run cannot match a plain one."""

        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return x * self.calls

    assert not validate_saved_activations(Drifting(), torch.ones(3), verbose=True)
    out = capsys.readouterr().out
    assert "output_1_2: outputs check failed" in out
    assert "max difference 1" in out and "FAILED" in out


def test_validation_leaves_model_and_inputs_unchanged() -> None:
    torch.manual_seed(0)
    model = TINY_MODELS["buffers"][0]()
    x = torch.randn(2, 4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x_before = x.clone()
    assert validate_saved_activations(model, x)
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert torch.equal(x, x_before)


# ----- what logging records for replay ---------------------------------------------------------
def test_ordinary_logging_records_no_function_args_or_rng() -> None:
    history = torchlog.log_forward_pass(TINY_MODELS["train_eval"][0](), torch.randn(5, 4))
    assert all(p.func_args is None and p.rng_state is None for p in history)


def test_function_args_and_rng_state_recorded_on_request() -> None:
    history = _log(TINY_MODELS["train_eval"][0](), torch.randn(5, 4))
    ops = [p for p in history if not (p.is_input or p.is_output or p.is_buffer or p.is_source)]
    assert ops and all(p.func_args is not None and p.rng_state is not None for p in ops)
    dropout = _middle_op(history, "dropout")
    func, args, _ = dropout.func_args
    with torch.random.fork_rng():
        torch.set_rng_state(dropout.rng_state)
        again = func(history[dropout.parents[0].label].tensor_contents, *args[1:])
    assert torch.equal(again, dropout.tensor_contents)
    # Ops that draw no random numbers share one state object instead of copying it.
    assert len({id(p.rng_state) for p in ops}) < len(ops)


def test_random_op_needs_its_recorded_rng_state() -> None:
    torch.manual_seed(0)
    history = _log(TINY_MODELS["train_eval"][0](), torch.randn(5, 4))
    assert not find_replay_problems(history).problems
    dropout = _middle_op(history, "dropout")
    dropout.rng_state = torch.Generator().manual_seed(12345).get_state()  # another state
    problems = find_replay_problems(history).problems
    assert [(p.label, p.check) for p in problems] == [(dropout.label, "replay")]
