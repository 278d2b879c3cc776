"""compare's figures on values near the limits of their dtype (finfo.max and finfo.min, as an
additive attention mask holds, tiny and subnormal values, zeros), against numpy in float64 and,
for float64 values, exact rational arithmetic."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from torch import nn

import torchlog
from tests.torchlog.comparison.test_compare_panel import check_stats, embedded_data, sections_of
from torchlog.comparison import Difference, Status, difference
from torchlog.comparison.magnitudes import magnitudes

FLOATS = [torch.float32, torch.float16, torch.bfloat16]
FMIN = torch.finfo(torch.float32).min


def numpy_figures(a: torch.Tensor, b: torch.Tensor) -> Difference:
    """The four figures of `Difference`, by its own definitions, in numpy float64 (bfloat16
    through an exact float32 upcast)."""
    x = a.detach().float().numpy().astype(np.float64).ravel()
    y = b.detach().float().numpy().astype(np.float64).ravel()
    # A mask's fills (each dtype's own finfo.max, signed) at the same places are left out.
    fill_x, fill_y = (np.sign(v) * (np.abs(v) == float(torch.finfo(t.dtype).max)) if t.is_floating_point()
                      else np.zeros_like(v) for v, t in ((x, a), (y, b)))
    if fill_x.any() and np.array_equal(fill_x, fill_y):
        x, y = x[fill_x == 0], y[fill_x == 0]
    d = x - y
    if d.size == 0:
        return Difference(0.0, 0.0, 0.0, 1.0)
    max_abs, scale = float(np.abs(d).max()), float(np.abs(x).max())
    if max_abs == 0.0:
        return Difference(0.0, 0.0, 0.0, 1.0)
    na, nb, nd = (float(np.linalg.norm(v)) for v in (x, y, d))
    max_rel = max_abs / scale if scale > 0 else math.inf
    rel_l2 = nd / na if na > 0 else math.inf
    cosine = 1.0 if na == nb == 0 else 0.0 if na == 0 or nb == 0 else float(np.dot(x, y)) / (na * nb)
    return Difference(max_abs, max_rel, rel_l2, cosine)


def assert_figures(found: Difference, want: Difference) -> None:
    assert found.max_abs == pytest.approx(want.max_abs, rel=1e-6), (found, want)
    assert found.max_rel == pytest.approx(want.max_rel, rel=1e-5), (found, want)
    assert found.rel_l2 == pytest.approx(want.rel_l2, rel=1e-5), (found, want)
    assert found.cosine == pytest.approx(want.cosine, abs=1e-6), (found, want)


def limit_pairs(dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Pairs of values of `dtype` at its limits, each pair of one shape."""
    info = torch.finfo(dtype)
    big, tiny, sub = info.max, info.tiny, info.tiny * info.eps  # sub: the smallest subnormal

    def t(*values: float) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float64).to(dtype)

    gen = torch.Generator().manual_seed(3)
    # Log-uniform over the whole range, subnormals included, random signs.
    exponents = torch.empty(2, 500, dtype=torch.float64)
    exponents.uniform_(math.log2(sub), math.log2(big) - 1, generator=gen)
    spread = (torch.randint(0, 2, (2, 500), generator=gen) * 2 - 1) * torch.exp2(exponents)
    noise = torch.randn(2, 400, dtype=torch.float64, generator=gen)
    near_max = (noise[0].clamp(-3, 3) * big / 4).to(dtype)
    moved = (near_max.double() * (1 + 1e-3 * noise[1])).clamp(-big, big).to(dtype)
    return [
        (t(0.3, 1.7, -big), t(0.3011, 1.7, -big)),  # an additive mask, one score moved
        (t(big, -big, 1.0), t(-big, big, 1.0)),  # a difference past the dtype's range
        (t(big, big, big), t(big, 0.5 * big, big)),
        (t(tiny, sub, 0.0, -tiny), t(sub, 0.0, tiny, -tiny)),  # tiny and subnormal only
        (t(sub, 0.0), t(0.0, sub)),
        (t(big, 1.0), t(sub, 0.0)),  # norms 1e38 apart: the cosine is summed
        (t(1.0, 2.0), t(2 * sub, sub)),
        (t(0.0, 0.0, 0.0), t(sub, 0.0, 0.0)),  # a all zeros: inf relative figures
        (t(sub, 0.0, -0.0), t(0.0, 0.0, 0.0)),
        (t(-0.0, 0.0), t(0.0, -0.0)),  # equal
        (near_max, moved),  # values up to 3/4 of finfo.max, moved by 1e-3
        (spread[0].to(dtype), spread[1].to(dtype)),
        (spread[0].to(dtype), (spread[0] * 1.01).clamp(-big, big).to(dtype)),
    ]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_difference_at_the_dtypes_limits_is_numpys_in_float64(dtype: torch.dtype) -> None:
    for a, b in limit_pairs(dtype):
        assert torch.isfinite(a).all() and torch.isfinite(b).all()
        assert_figures(difference(a, b), numpy_figures(a, b))
        assert_figures(difference(b, a), numpy_figures(b, a))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_difference_of_float32_against_a_narrow_dtype_at_its_limits(dtype: torch.dtype) -> None:
    for a, _ in limit_pairs(dtype):
        wide = a.float() * (1 + 1e-3 * torch.linspace(-1, 1, a.numel()))  # float32 values near a's
        assert_figures(difference(wide, a), numpy_figures(wide, a))


def test_difference_beside_nonfinite_values_at_the_limits() -> None:
    a = torch.tensor([float("-inf"), FMIN, 0.5, float("nan")])
    b = torch.tensor([float("-inf"), -FMIN, 0.25, float("nan")])
    found = difference(a, b)  # over the finite places: FMIN against -FMIN, 0.5 against 0.25
    assert_figures(found, numpy_figures(a[1:3], b[1:3]))
    assert found.max_abs == pytest.approx(2 * -FMIN) and math.isfinite(found.max_abs)


def _exact(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float, float]:
    """max_abs, max_rel, rel_l2, cosine of float64 values with exact rational sums."""
    x, y = ([Fraction(v) for v in t.tolist()] for t in (a, b))
    d = [p - q for p, q in zip(x, y)]
    max_abs, scale = max(abs(v) for v in d), max(abs(v) for v in x)
    sx, sy, sd = (sum(v * v for v in vs) for vs in (x, y, d))
    dot = sum(p * q for p, q in zip(x, y))
    cosine = (1 if dot >= 0 else -1) * math.sqrt(dot * dot / (sx * sy))
    return _float(max_abs), float(max_abs / scale), math.sqrt(sd / sx), cosine


def _float(value: Fraction) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.inf


def test_difference_of_float64_values_at_their_limits_is_exact() -> None:
    info = torch.finfo(torch.float64)
    big, sub = info.max, info.tiny * info.eps
    pairs = [([big, -big, 1.0], [big, -big * 0.75, 1.0]), ([big, 2.0], [-big, 1.0]),
             ([sub, 3 * sub, 0.0], [2 * sub, sub, sub]), ([big, 1.0], [sub, 1.0]),
             ([1e300, 1e-300], [1e-300, 1e300])]
    for a, b in pairs:
        x, y = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
        found, (max_abs, max_rel, rel_l2, cosine) = difference(x, y), _exact(x, y)
        assert found.max_abs == pytest.approx(max_abs, rel=1e-12)
        assert found.max_rel == pytest.approx(max_rel, rel=1e-12)
        assert found.rel_l2 == pytest.approx(rel_l2, rel=1e-12)
        assert found.cosine == pytest.approx(cosine, abs=1e-12)


def test_magnitudes_of_a_mask_and_of_subnormals() -> None:
    info = torch.finfo(torch.float32)
    mask = torch.tensor([0.0, FMIN, FMIN, FMIN])
    subnormal = torch.full((9,), info.tiny * info.eps)
    found = magnitudes([mask, subnormal, torch.zeros(3)])
    assert found[0].peak == -FMIN and found[0].spread == pytest.approx(math.sqrt(3))
    assert found[1].peak == info.tiny * info.eps and found[1].spread == pytest.approx(3.0)
    assert found[2].peak == 0.0 and found[2].spread == 0.0
    assert found[0].ratio(found[1]) == pytest.approx(-FMIN * math.sqrt(3) / (3 * info.tiny * info.eps))
    # From the norm alone where that is exact (a norm of 2.0 for four ones), else as above.
    ones = torch.ones(4)
    alone = magnitudes([ones], norm_only=[mask, subnormal, torch.zeros(3), ones])
    assert alone[1:4] == found and alone[4] == (2.0, 1.0)
    assert alone[4].ratio(alone[0]) == 1.0
    assert alone[1].ratio(alone[4]) == pytest.approx(-FMIN * math.sqrt(3) / 2)


class MaskedScores(nn.Module):
    """A Linear's output plus an additive mask holding float32's lowest value."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + torch.tensor([0.0, FMIN])


def test_additive_mask_under_autocast_differs_by_its_scores_not_inf() -> None:
    torch.manual_seed(0)
    model, x = MaskedScores(), torch.randn(3, 2)
    a = torchlog.log_forward_pass(model, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        b = torchlog.log_forward_pass(model, x, save_function_args=True)
    comparison = torchlog.compare(a, b)
    add = comparison["add_1_3"]
    scores_a, scores_b = (h["linear_1_1"].tensor_contents.detach() for h in (a, b))
    unmasked = (scores_a - scores_b.float())[:, 0]  # the mask adds 0 to column 0
    assert add.max_abs_diff == pytest.approx(float(unmasked.abs().max()), rel=1e-6)
    assert 1e-4 < add.max_abs_diff < 1e-2
    for row in comparison:  # every figure of every pass against numpy
        assert row.diff is not None and row.status == Status.MATCH, row
        values = (a[row.label_a].tensor_contents, b[row.label_b].tensor_contents)
        assert_figures(row.diff, numpy_figures(*values))
    # The add's local error: its parent in b is the bf16 Linear's output; a's, cast, plus the mask.
    rerun = a["linear_1_1"].tensor_contents.to(torch.bfloat16) + torch.tensor([0.0, FMIN])
    assert_figures(add.local, numpy_figures(a["add_1_3"].tensor_contents, rerun))
    assert comparison.first_divergence is None and comparison.origins == []


def test_additive_mask_after_a_changed_weight_names_the_weight() -> None:
    torch.manual_seed(0)
    model, x = MaskedScores(), torch.randn(3, 2)
    a = torchlog.log_forward_pass(model, x)
    with torch.no_grad():
        model.fc.weight[0, 0] += 1e-3
    b = torchlog.log_forward_pass(model, x)
    comparison = torchlog.compare(a, b)
    assert comparison.first_divergence.label_a == "linear_1_1"
    add = comparison["add_1_3"]
    assert math.isfinite(add.max_abs_diff) and add.max_abs_diff == pytest.approx(
        comparison["linear_1_1"].max_abs_diff, rel=1e-6)
    assert_figures(add.diff, numpy_figures(a["add_1_3"].tensor_contents, b["add_1_3"].tensor_contents))


class Shifted(nn.Module):
    """Its input plus a constant."""

    def __init__(self, shift: list[float]) -> None:
        super().__init__()
        self.shift = shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tensor(self.shift)


def test_page_takes_a_difference_past_float32s_range_in_float64(tmp_path) -> None:
    x = torch.tensor([[0.5, 1.0], [2.0, -1.0]])
    a = torchlog.log_forward_pass(Shifted([0.0, FMIN]), x)
    b = torchlog.log_forward_pass(Shifted([0.0, -FMIN]), x)  # the mask's sign flipped
    comparison = torchlog.compare(a, b)
    add = comparison["add_1_2"]
    assert add.status == Status.DIFFERS and add.max_abs_diff == pytest.approx(-2 * FMIN)
    assert_figures(add.diff, numpy_figures(a["add_1_2"].tensor_contents, b["add_1_2"].tensor_contents))
    sections = sections_of(embedded_data(comparison.to_html(str(tmp_path / "flipped.html"))), "add_1_2")
    table = sections["difference a - b (float64)"]
    check_stats(table, a["add_1_2"].tensor_contents.double() - b["add_1_2"].tensor_contents.double())
    assert table["Inf"] == 0 and table["min"] == pytest.approx(2 * FMIN)
    assert sections["comparison"]["max |a - b|"] == pytest.approx(-2 * FMIN)


class OwnMask(nn.Module):
    """A Linear's output plus a mask holding the lowest value of the model's own dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + torch.tensor([0.0, torch.finfo(x.dtype).min], dtype=x.dtype)


def test_local_error_casts_a_float32_mask_to_bfloat16s_lowest_value_not_inf() -> None:
    torch.manual_seed(0)
    model, x = OwnMask(), torch.randn(3, 2)
    a = torchlog.log_forward_pass(model, x)
    b = torchlog.log_forward_pass(model.to(torch.bfloat16), x.to(torch.bfloat16),
                                  save_function_args=True)
    add = torchlog.compare(a, b)["add_1_3"]
    bf16_min = torch.finfo(torch.bfloat16).min
    mask = torch.tensor([0.0, bf16_min], dtype=torch.bfloat16)
    rerun = a["linear_1_1"].tensor_contents.to(torch.bfloat16) + mask
    assert torch.isfinite(rerun).all() and add.local is not None
    assert_figures(add.local, numpy_figures(a["add_1_3"].tensor_contents, rerun))
    assert add.adds_error is False  # bfloat16's rounding, within its tolerance


class MaskedSoftmax(nn.Module):
    """Scores, an additive mask holding float32's lowest value, and a softmax over them."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc(x) + torch.tensor([0.0, 0.0, FMIN]), dim=-1)


def test_a_masked_add_is_judged_by_its_unmasked_values() -> None:
    """The mask's fills sit at the same places in both runs and are left out of the figures,
    max |a| included: scores moved by 0.05 make the add differ (before, its scale was
    finfo.max and it matched under any rtol), and the softmax after it is no origin."""
    torch.manual_seed(0)
    model, x = MaskedSoftmax(), torch.randn(4, 3)
    a = torchlog.log_forward_pass(model, x)
    with torch.no_grad():
        model.fc.bias += 0.05
    b = torchlog.log_forward_pass(model, x)
    comparison = torchlog.compare(a, b)
    add = comparison["add_1_3"]
    scores = a["linear_1_1"].tensor_contents[:, :2]
    assert add.status == Status.DIFFERS
    assert add.diff.max_abs == pytest.approx(0.05, rel=1e-4)
    assert add.diff.max_rel == pytest.approx(0.05 / float(scores.abs().max()), rel=1e-4)
    assert_figures(add.diff, numpy_figures(a["add_1_3"].tensor_contents, b["add_1_3"].tensor_contents))
    assert [row.label_a for row in comparison.origins] == ["linear_1_1"]
    # A mask that moved is a difference of about finfo.max, not a place left out.
    moved = torch.tensor([[0.0, FMIN, 0.0]])
    found = difference(torch.tensor([[0.0, 0.0, FMIN]]), moved)
    assert found.max_abs == pytest.approx(-FMIN) and found.max_rel == pytest.approx(1.0)
