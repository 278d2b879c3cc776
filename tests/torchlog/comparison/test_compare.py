"""torchlog.compare: two runs compared op by op, against differences computed with plain PyTorch."""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlog
from tests.models import TINY_MODELS
from torchlog.comparison import Difference, Status, Tolerance, align, difference, first_nonfinite
from torchlog.comparison.report import source_line
from torchlog.comparison.statuses import random_draws
from torchlog.interventions import zero_ablate
from torchlog.comparison.tolerances import default_tolerance, precision_of


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class CastingPort(nn.Module):
    """Mlp ported with renamed modules and its first Linear in bfloat16, cast in and out."""

    def __init__(self, mlp: Mlp) -> None:
        super().__init__()
        self.first = copy.deepcopy(mlp.fc1).to(torch.bfloat16)
        self.second = copy.deepcopy(mlp.fc2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x.to(torch.bfloat16)).to(torch.float32)
        return self.second(torch.relu(h))


def _log(model: nn.Module, x: torch.Tensor, **options) -> torchlog.ModelHistory:
    return torchlog.log_forward_pass(model, x, random_seed=0, **options)


# ----- differences against plain PyTorch ---------------------------------------------------------
@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.float64, torch.float32),
                                    (torch.float32, torch.bfloat16)], ids=str)
def test_difference_figures_are_plain_torch_figures(dtypes) -> None:
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(7, 5, generator=gen, dtype=torch.float64).to(dtypes[0])
    b = (a.double() + 1e-2 * torch.randn(7, 5, generator=gen, dtype=torch.float64)).to(dtypes[1])
    x, y = a.double(), b.double()
    found = difference(a, b)
    assert found.max_abs == pytest.approx(float((x - y).abs().max()), rel=1e-5)
    assert found.max_rel == pytest.approx(float((x - y).abs().max() / x.abs().max()), rel=1e-5)
    assert found.rel_l2 == pytest.approx(float((x - y).norm() / x.norm()), rel=1e-5)
    assert found.cosine == pytest.approx(float(F.cosine_similarity(x.flatten(), y.flatten(), dim=0)),
                                         abs=1e-6)


def test_difference_of_nonfinite_values() -> None:
    a = torch.tensor([1.0, float("nan"), float("inf"), 2.0])
    same_places = torch.tensor([1.5, float("nan"), float("inf"), 2.0])
    found = difference(a, same_places)
    assert found.max_abs == 0.5 and found.max_rel == pytest.approx(0.25)  # over the finite places
    assert difference(a, a.clone()) == Difference(0.0, 0.0, 0.0, 1.0)
    moved = torch.tensor([1.0, 0.0, float("inf"), 2.0])
    apart = difference(a, moved)
    assert math.isinf(apart.max_abs) and not apart.within(Tolerance(1.0, 1.0))
    assert math.isinf(difference(a, -a).max_abs)  # +inf against -inf


def test_difference_of_integers_and_zeros() -> None:
    found = difference(torch.tensor([1, 5, 3]), torch.tensor([1, 2, 3]))
    assert found.max_abs == 3.0 and not found.within(Tolerance(0.0, 0.0))
    zeros = difference(torch.zeros(3), torch.zeros(3))
    assert zeros == Difference(0.0, 0.0, 0.0, 1.0)
    from_zero = difference(torch.zeros(3), torch.ones(3))
    assert math.isinf(from_zero.max_rel) and from_zero.cosine == 0.0
    assert from_zero.within(Tolerance(0.0, 1.0)) and not from_zero.within(Tolerance(0.0, 0.5))


def test_tolerance_is_atol_plus_rtol_times_largest_value() -> None:
    a = torch.tensor([10.0, -4.0, 0.001])
    tolerance = Tolerance(1e-3, 1e-4)
    limit = 1e-4 + 1e-3 * 10.0  # atol + rtol * max|a|
    inside, outside = a.clone(), a.clone()
    inside[2] += 0.9 * limit  # far above rtol * |a[2]|: only the whole tensor's scale counts
    outside[2] += 1.1 * limit
    assert difference(a, inside).within(tolerance)
    assert not difference(a, outside).within(tolerance)


def test_default_tolerances_follow_dtype() -> None:
    assert default_tolerance(precision_of(torch.float64)).rtol < 1e-9
    assert default_tolerance(precision_of(torch.float32)) == Tolerance(1e-5, 1e-7)
    assert default_tolerance(precision_of(torch.bfloat16)).rtol == 1e-2
    assert default_tolerance(precision_of(torch.float16)).rtol == 1e-2
    assert default_tolerance(precision_of(torch.int64)) == Tolerance(0.0, 0.0)


# ----- a model against itself --------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_model_against_itself_matches_everywhere(name: str) -> None:
    make_model, make_input = TINY_MODELS[name]
    torch.manual_seed(0)
    model, x = make_model(), make_input()
    a, b = _log(model, x), _log(model, x)
    comparison = torchlog.compare(a, b)
    assert comparison.alignment == "label"
    assert [row.label_a for row in comparison] == a.layer_labels
    assert {row.status for row in comparison} <= {Status.MATCH, Status.NOT_COMPARABLE}
    assert all(row.func_name in ("empty", "empty_like", "new_empty")
               for row in comparison if row.status == Status.NOT_COMPARABLE)
    assert comparison.first_divergence is None and comparison.origins == []
    assert "No divergence" in str(comparison)


# ----- where a difference is born ----------------------------------------------------------------
def test_changed_weight_is_the_first_divergence_and_local_error_is_the_plain_difference() -> None:
    torch.manual_seed(0)
    model, x = Mlp(), torch.randn(3, 8)
    changed = copy.deepcopy(model)
    with torch.no_grad():
        changed.fc2.weight[1, 2] += 1e-2
    a, b = _log(model, x), _log(changed, x, save_function_args=True)
    comparison = torchlog.compare(a, b)
    first = comparison.first_divergence
    assert first is not None and first.module == "fc2" and first.func_name == "linear"
    assert comparison.origins == [first]
    before = comparison.rows[:first.position]
    assert before and all(row.status == Status.MATCH for row in before)
    assert [row.status for row in comparison.rows[first.position:]] == [Status.DIFFERS] * 2
    hidden = torch.relu(model.fc1(x)).detach()
    plain_a, plain_b = model.fc2(hidden).detach(), changed.fc2(hidden).detach()
    assert first.local.max_abs == pytest.approx(float((plain_b - plain_a).abs().max()), rel=1e-5)
    assert first.local.rel_l2 == pytest.approx(float((plain_b - plain_a).norm() / plain_a.norm()), rel=1e-5)
    assert first.local.within(first.tolerance) is False and first.adds_error
    assert [row.local for row in before[1:]] == [Difference(0.0, 0.0, 0.0, 1.0)] * 2  # fc1, relu
    assert comparison.rows[-1].local is None  # the model's output is no op to re-run
    assert comparison.adding_most(10) == [first]


def test_rows_after_the_divergence_only_carry_it() -> None:
    torch.manual_seed(0)
    model, x = Mlp(), torch.randn(3, 8)
    changed = copy.deepcopy(model)
    with torch.no_grad():
        changed.fc1.weight[0, 0] += 1e-2
    comparison = torchlog.compare(_log(model, x), _log(changed, x, save_function_args=True))
    assert comparison.first_divergence.module == "fc1"
    for label in ("relu_1_2", "linear_2_3"):  # re-run on a's parents, b's op gives a's value
        row = comparison[label]
        assert row.status == Status.DIFFERS and row.diff.max_abs > 0
        assert row.local == Difference(0.0, 0.0, 0.0, 1.0) and row.adds_error is False
    plain = F.linear(x, changed.fc1.weight, changed.fc1.bias).detach()
    assert comparison["linear_1_1"].local == pytest.approx(difference(model.fc1(x).detach(), plain))


def test_two_independent_changes_are_two_origins() -> None:
    class TwoBranches(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.left, self.right = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return self.left(x).relu() + self.right(x).tanh()

    torch.manual_seed(0)
    model, x = TwoBranches(), torch.randn(2, 4)
    changed = copy.deepcopy(model)
    with torch.no_grad():
        changed.left.bias += 0.1
        changed.right.weight[0, 0] += 0.1
    comparison = torchlog.compare(_log(model, x), _log(changed, x))
    assert [row.module for row in comparison.origins] == ["left", "right"]
    assert comparison.first_divergence.module == "left"
    # Without local errors the ranking is the growth of relative L2 over the parents'.
    assert {row.module for row in comparison.adding_most(2)} == {"left", "right"}


def test_changed_input_is_the_origin() -> None:
    torch.manual_seed(0)
    model, x = Mlp(), torch.randn(3, 8)
    comparison = torchlog.compare(_log(model, x), _log(model, x + 1e-3))
    assert comparison.first_divergence.label_a == "input_1_0"
    assert comparison.first_divergence.diff.max_abs == pytest.approx(1e-3, rel=1e-3)


def test_user_tolerances_override_the_defaults() -> None:
    torch.manual_seed(0)
    model, x = Mlp(), torch.randn(3, 8)
    a, b = _log(model, x), _log(model, x * (1 + 1e-4))
    assert torchlog.compare(a, b).counts["differs"] > 0
    loose = torchlog.compare(a, b, rtol=1e-3)
    assert loose.counts["differs"] == 0 and loose.first_divergence is None
    assert all(row.tolerance.rtol == 1e-3 for row in loose if row.dtype_a.is_floating_point)
    assert torchlog.compare(a, b, rtol=0, atol=1.0).counts["differs"] == 0


# ----- values no run can reproduce ---------------------------------------------------------------
class Noisy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.drop = nn.Linear(4, 4), nn.Dropout(0.5)

    def forward(self, x):
        scratch = torch.empty_like(x)
        scratch.copy_(x * 2)
        return self.drop(self.fc(scratch)) + 1


@pytest.mark.parametrize("save_function_args", [False, True], ids=["by-name", "by-rng-state"])
def test_random_draws_compare_only_under_one_seed(save_function_args: bool) -> None:
    torch.manual_seed(0)
    model, x = Noisy().train(), torch.randn(8, 4)
    logs = [torchlog.log_forward_pass(model, x, random_seed=seed, save_function_args=save_function_args)
            for seed in (1, 2, 1)]
    apart = torchlog.compare(logs[0], logs[1])
    assert apart["emptylike_1_1"].status == Status.NOT_COMPARABLE
    assert apart["copy_1_3"].status == Status.MATCH  # the op filling it is compared as usual
    assert apart["dropout_1_5"].status == Status.NOT_COMPARABLE
    assert apart["add_1_6"].status == Status.DIFFERS  # carried from the draw: no origin
    assert apart.origins == []
    same = torchlog.compare(logs[0], logs[2])
    assert same["dropout_1_5"].status == Status.MATCH and same["add_1_6"].status == Status.MATCH
    model.eval()  # no draw: a carried difference in a dropout is a difference
    plain = torchlog.compare(*(torchlog.log_forward_pass(model, x * s, random_seed=seed)
                               for s, seed in ((1, 1), (2, 2))))
    assert plain["dropout_1_5"].status == Status.DIFFERS


class Filled(nn.Module):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def forward(self, x):
        scratch = torch.empty_like(x)
        scratch.fill_(self.value)
        return x + scratch


class Draws(nn.Module):
    def __init__(self, training: bool) -> None:
        super().__init__()
        self.dropping = training

    def forward(self, x):
        first, second = torch.randn(2, 3).unbind(0)  # unbind: two outputs of one call, no draw
        dropped = F.dropout(x * 2, 0.5, training=self.dropping)
        kept, mask = torch.native_dropout(x, 0.5, True)  # one call drawing, two outputs
        return dropped + first + second + kept * mask


def test_random_draws_by_rng_state_and_by_name() -> None:
    x = torch.randn(3)
    drawing = {"randn_1_1", "dropout_1_5", "nativedropout_1_6", "nativedropout_2_7"}
    assert random_draws(_log(Draws(True), x, save_function_args=True)) == drawing
    assert random_draws(_log(Draws(True), x)) == drawing
    assert random_draws(_log(Draws(False), x, save_function_args=True)) == drawing - {"dropout_1_5"}
    # Without RNG states, an eval-mode dropout gives back its input: one saved value for both.
    assert random_draws(_log(Draws(False), x)) == drawing - {"dropout_1_5"}
    assert random_draws(_log(Draws(False), x, layers_to_save=None)) == drawing  # no values: by name


def test_op_filling_an_empty_tensor_is_the_origin_of_what_it_fills_in() -> None:
    x = torch.randn(2, 3)
    comparison = torchlog.compare(_log(Filled(1.0), x), _log(Filled(2.0), x))
    assert [str(row.status) for row in comparison] == ["match", "not_comparable", "differs", "differs",
                                                      "differs"]
    assert comparison.first_divergence.func_name == "fill_"  # its one parent holds no values
    assert len(comparison.origins) == 1


class Exponential(nn.Module):
    def forward(self, x):
        return torch.exp(10 * x)


def test_a_difference_grown_past_tolerance_is_no_origin_when_the_op_adds_none() -> None:
    x = torch.randn(4, 5)
    a = _log(Exponential(), x)
    nudged = x * (1 + 3e-6)  # inside float32's tolerance: exp turns it into up to 10 |x| 3e-6
    comparison = torchlog.compare(a, _log(Exponential(), nudged, save_function_args=True))
    assert [str(row.status) for row in comparison] == ["match", "match", "differs", "differs"]
    exp = comparison.rows[2]
    assert exp.local == Difference(0.0, 0.0, 0.0, 1.0) and exp.adds_error is False
    assert comparison.origins == [] and comparison.first_divergence is None
    assert "No op adds a difference on its own; the first row that differs is exp_1_2" in str(comparison)
    without_local = torchlog.compare(a, _log(Exponential(), nudged))  # by parents alone: exp
    assert [row.label_a for row in without_local.origins] == ["exp_1_2"]


# ----- alignment ---------------------------------------------------------------------------------
def test_port_with_inserted_casts_and_renamed_modules_aligns() -> None:
    torch.manual_seed(0)
    model, x = Mlp(), torch.randn(3, 8)
    a, b = _log(model, x), _log(CastingPort(model), x, save_function_args=True)
    comparison = torchlog.compare(a, b)
    assert comparison.alignment == "sequence"
    assert [(row.label_a, row.label_b) for row in comparison if row.is_paired] == [
        ("input_1_0", "input_1_0"), ("linear_1_1", "linear_1_2"), ("relu_1_2", "relu_1_4"),
        ("linear_2_3", "linear_2_5"), ("output_1_4", "output_1_6")]
    only_b = [row for row in comparison if row.status == Status.ONLY_B]
    assert [(row.label_b, row.func_name) for row in only_b] == [("to_1_1", "to"), ("to_2_3", "to")]
    assert [row.position for row in only_b] == [1, 3]  # where they ran
    # Everything downstream of the bfloat16 Linear is judged at bfloat16's tolerance.
    assert comparison.counts["differs"] == 0 and comparison.origins == []
    assert comparison["relu_1_2"].tolerance.rtol == 1e-2 and comparison["input_1_0"].tolerance.rtol == 1e-5
    first = comparison["linear_1_1"]  # re-run through b's inserted cast, from a's input
    weight = model.fc1.weight.detach().to(torch.bfloat16)
    plain = F.linear(x.to(torch.bfloat16), weight, model.fc1.bias.detach().to(torch.bfloat16))
    expected = difference(a["linear_1_1"].tensor_contents, plain)
    assert first.local == pytest.approx(expected, rel=1e-6)
    # relu's input in b is a float32 cast of a bfloat16 value: a's value goes through both.
    through = torch.relu(a["linear_1_1"].tensor_contents.to(torch.bfloat16).float())
    assert comparison["relu_1_2"].local == pytest.approx(difference(a["relu_1_2"].tensor_contents, through))
    assert comparison["relu_1_2"].local.max_abs > 0
    assert all(row.local is not None for row in comparison if row.is_paired and row.label_a != "input_1_0"
               and row.label_a != "output_1_4")


def test_alignment_pairs_in_execution_order_around_an_extra_op() -> None:
    class Refactored(Mlp):
        def forward(self, x):
            h = torch.relu(self.fc1(x)).reshape(3, 16)  # the refactor adds a reshape
            return self.fc2(h)

    torch.manual_seed(0)
    model, x = Mlp(), torch.randn(3, 8)
    refactored = Refactored()
    refactored.load_state_dict(model.state_dict())
    pairs, how = align(_log(model, x).passes, _log(refactored, x).passes)
    assert how == "sequence"
    assert [(p.a and p.a.label, p.b and p.b.label) for p in pairs] == [
        ("input_1_0", "input_1_0"), ("linear_1_1", "linear_1_1"), ("relu_1_2", "relu_1_2"),
        (None, "reshape_1_3"), ("linear_2_3", "linear_2_4"), ("output_1_4", "output_1_5")]


def test_shape_mismatch_under_one_label() -> None:
    a = torchlog.log_forward_pass(nn.Linear(4, 3), torch.randn(2, 4))
    b = torchlog.log_forward_pass(nn.Linear(4, 3), torch.randn(5, 4))
    comparison = torchlog.compare(a, b)
    assert comparison.alignment == "label"
    assert [row.status for row in comparison] == [Status.SHAPE] * 3
    assert comparison.first_divergence.label_a == "input_1_0"


# ----- views -------------------------------------------------------------------------------------
def test_print_shows_counts_divergence_site_and_ranking() -> None:
    torch.manual_seed(0)
    model, x = Mlp(), torch.randn(3, 8)
    changed = copy.deepcopy(model)
    with torch.no_grad():
        changed.fc1.bias[0] += 1.0
    text = str(torchlog.compare(_log(model, x), _log(changed, x, save_function_args=True)))
    assert "match 1, differs 4, shape 0, only_a 0, only_b 0, not_saved 0, not_comparable 0" in text
    assert "First divergence: linear_1_1 [differs]" in text
    assert "module fc1, function linear" in text
    file, line, source = source_line(_log(model, x)["linear_1_1"].call_site)
    assert file == __file__ and f"{file}:{line}: {source}" in text
    assert source == "return self.fc2(torch.relu(self.fc1(x)))"
    assert "Rows that add the most error (local error" in text


def test_to_pandas_has_one_row_per_row() -> None:
    pd = pytest.importorskip("pandas")
    torch.manual_seed(0)
    model, x = Mlp(), torch.randn(3, 8)
    comparison = torchlog.compare(_log(model, x), _log(CastingPort(model), x, save_function_args=True))
    frame = comparison.to_pandas()
    assert isinstance(frame, pd.DataFrame) and len(frame) == len(comparison)
    assert list(frame["status"]) == [str(row.status) for row in comparison]
    for (_, record), row in zip(frame.iterrows(), comparison):
        if row.diff is not None:
            assert record["rel_l2"] == row.diff.rel_l2 and record["max_abs_diff"] == row.diff.max_abs
        if row.local is not None:
            assert record["local_rel_l2"] == row.local.rel_l2


def test_rows_by_label_and_position() -> None:
    torch.manual_seed(0)
    model, x = Mlp(), torch.randn(3, 8)
    comparison = torchlog.compare(_log(model, x), _log(CastingPort(model), x))
    assert comparison["relu_1_2"].label_b == "relu_1_4"
    assert comparison["to_2_3"].status == Status.ONLY_B  # b's label, for a pass only b ran
    assert comparison[-1].label_a == "output_1_4"
    with pytest.raises(torchlog.LayerNotFoundError, match="relu_1_2"):
        comparison["relu_1_3"]


# ----- bad input ---------------------------------------------------------------------------------
def test_bad_input_names_the_value() -> None:
    history = torchlog.log_forward_pass(nn.Linear(2, 2), torch.randn(1, 2))
    with pytest.raises(torchlog.InvalidArgumentTypeError, match=r"b is \[1, 2\] of type list"):
        torchlog.compare(history, [1, 2])
    for bad in (-1e-3, float("nan"), "0.1", True):
        with pytest.raises(torchlog.InvalidOptionError, match=r"rtol must be .* got " + repr(bad)[:3]):
            torchlog.compare(history, history, rtol=bad)
    with pytest.raises(torchlog.InvalidOptionError, match=r"atol .* got -1"):
        torchlog.compare(history, history, atol=-1)
    unsaved = torchlog.log_forward_pass(nn.Linear(2, 2), torch.randn(1, 2), layers_to_save=None)
    with pytest.raises(torchlog.ComparisonError, match=r"history a .* saved no values .*layers_to_save=None"):
        torchlog.compare(unsaved, history)
    other = torchlog.log_forward_pass(nn.Conv1d(1, 1, 1), torch.randn(1, 1, 5))
    with pytest.raises(torchlog.ComparisonError, match="share no op"):
        torchlog.compare(history, other)
    assert isinstance(torchlog.ComparisonError("x"), ValueError)


def test_no_local_errors_without_function_arguments() -> None:
    torch.manual_seed(0)
    model, x = Mlp(), torch.randn(3, 8)
    comparison = torchlog.compare(_log(model, x, save_function_args=True), _log(model, x))
    assert all(row.local is None for row in comparison) and not comparison.has_local_errors


# ----- non-finite values ---------------------------------------------------------------------------
class NanInBlockOne(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

    def forward(self, x):
        for index, block in enumerate(self.blocks):
            x = block(x)
            if index == 1:
                x = (x - 100).log() + x  # log of a negative value: NaN
        return x


def test_first_nonfinite_names_the_op() -> None:
    torch.manual_seed(0)
    history = _log(NanInBlockOne(), torch.randn(2, 4))
    found = first_nonfinite(history)
    assert found is not None and found.func_name == "log" and found.label == "log_1_4"
    parents = [history[label].tensor_contents for label in found.parent_labels]
    assert all(bool(torch.isfinite(p).all()) for p in parents)
    assert torch.isnan(found.tensor_contents).any()
    assert first_nonfinite(_log(nn.Linear(4, 4), torch.randn(2, 4))) is None
    broken = _log(nn.Linear(4, 4), torch.full((2, 4), float("nan")))
    assert first_nonfinite(broken) is broken[0]  # the input itself
    with pytest.raises(torchlog.InvalidArgumentTypeError, match="got 3 of type int"):
        first_nonfinite(3)


def test_find_nonfinite_stops_at_the_op() -> None:
    torch.manual_seed(0)
    model, x = NanInBlockOne(), torch.randn(2, 4)
    full = _log(model, x)
    found = torchlog.find_nonfinite(model, x, random_seed=0)
    assert found.label == first_nonfinite(full).label == "log_1_4"
    file, line, source = source_line(found.call_site)
    assert file == __file__ and source == "x = (x - 100).log() + x  # log of a negative value: NaN"
    assert found.module is None and torch.isnan(found.tensor_contents).any()
    assert full["log_1_4"].children == ("add_1_5",)
    assert found.children == ()  # the logged pass stopped right after it: nothing read it
    assert torchlog.find_nonfinite(Mlp(), torch.randn(3, 8)) is None
    assert torchlog.find_nonfinite(nn.Identity(), torch.ones(2)) is None  # no op at all


class NanThenMore(nn.Module):
    """A NaN made by `log` between two modules; more modules after it."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
        self.after = nn.Tanh()

    def forward(self, x):
        x = self.blocks[1](self.blocks[0](x))
        x = self.after((x - 100).log())  # log of a negative value: NaN
        return self.blocks[2](x)


def test_find_nonfinite_runs_the_model_once_and_nothing_after_the_op() -> None:
    torch.manual_seed(0)
    model, x = NanThenMore(), torch.randn(2, 4)
    with torch.no_grad():  # the oracle: the same ops in plain PyTorch
        expected = (model.blocks[1](model.blocks[0](x)) - 100).log()
    calls = {"blocks.0": 0, "blocks.1": 0, "after": 0, "blocks.2": 0}
    handles = [module.register_forward_pre_hook(lambda m, args, name=name: calls.__setitem__(name, calls[name] + 1))
               for name, module in model.named_modules() if name in calls]
    try:
        found = torchlog.find_nonfinite(model, x, random_seed=0)
        assert calls == {"blocks.0": 1, "blocks.1": 1, "after": 0, "blocks.2": 0}
        assert found.func_name == "log" and found.children == ()
        torch.testing.assert_close(found.tensor_contents, expected, equal_nan=True)
        assert bool(torch.isnan(expected).any())
        model(x)  # capture left nothing behind: the model runs whole again
        assert calls == {"blocks.0": 2, "blocks.1": 2, "after": 1, "blocks.2": 1}
    finally:
        for handle in handles:
            handle.remove()


def test_find_nonfinite_names_an_input_that_holds_one() -> None:
    x = torch.randn(3, 8)
    x[1, 2] = float("inf")
    found = torchlog.find_nonfinite(Mlp(), x)
    assert found.label == "input_1_0"


def test_to_html_colours_run_a_by_difference_over_tolerance_and_opens_on_the_first_divergence(tmp_path) -> None:
    import json

    from torchlog.comparison.page import LEGEND

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    x = torch.randn(3, 4)
    changed = copy.deepcopy(model)
    with torch.no_grad():
        changed[2].weight[0, 0] += 1e-2
    comparison = torchlog.compare(torchlog.log_forward_pass(model, x), torchlog.log_forward_pass(changed, x))
    assert comparison.first_divergence.label_a == "linear_2_3"
    text = open(comparison.to_html(str(tmp_path / "diff.html")), encoding="utf-8").read()
    assert json.dumps(LEGEND) in text and json.dumps("linear_2_3") in text


def test_an_eval_mode_dropout_edited_in_one_run_is_where_the_runs_part() -> None:
    """Dropout in eval mode gives back its input, so it draws nothing: runs with different
    seeds still compare there, and zeroing an MLP whose last op is its dropout is the first
    divergence (it was 'not comparable' by the op's name, and the divergence went unnamed)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
                                     bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    model, ids = transformers.GPT2LMHeadModel(config).eval(), torch.randint(0, 100, (1, 8))
    a = torchlog.log_forward_pass(model, ids, random_seed=1)
    b = torchlog.log_forward_pass(model, ids, random_seed=2, intervene={"transformer.h.1.mlp": zero_ablate()})
    (fired,) = b.interventions
    assert torchlog.compare(a, b).first_divergence.label_a == fired.label
