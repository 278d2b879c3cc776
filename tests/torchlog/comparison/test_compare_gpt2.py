"""torchlog.compare on a tiny GPT-2 (transformers, no downloads): one changed weight, and bf16 autocast;
with eager attention, whose additive mask holds float32's lowest value."""
from __future__ import annotations

import copy
import math

import pytest
import torch
import transformers

import torchlog
from torchlog.comparison import Status, difference
from tests.torchlog.comparison.test_compare_limits import assert_figures, numpy_figures
from tests.torchlog.comparison.test_compare_panel import embedded_data, sections_of
from torchlog.comparison.local_error import can_rerun

pytestmark = pytest.mark.heavy

SEQ = 16
CASTS = {"to", "type", "float", "half", "bfloat16", "_to_copy"}


@pytest.fixture(scope="module")
def gpt2() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=3, n_embd=32, n_head=2, vocab_size=100, n_positions=SEQ,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval(), torch.randint(0, 100, (1, SEQ))


@pytest.fixture(scope="module")
def fp32_run(gpt2) -> torchlog.ModelHistory:
    model, ids = gpt2
    return torchlog.log_forward_pass(model, ids)  # a drawn seed: runs below draw others


def test_gpt2_against_itself_matches(gpt2, fp32_run) -> None:
    model, ids = gpt2
    comparison = torchlog.compare(fp32_run, torchlog.log_forward_pass(model, ids))
    assert comparison.counts["match"] == len(fp32_run) and comparison.first_divergence is None


def test_changed_mlp_weight_of_block_2(gpt2, fp32_run) -> None:
    model, ids = gpt2
    changed = copy.deepcopy(model)
    with torch.no_grad():
        changed.transformer.h[2].mlp.c_fc.weight[3, 5] += 1e-3
    comparison = torchlog.compare(fp32_run, torchlog.log_forward_pass(changed, ids, save_function_args=True))
    first = comparison.first_divergence
    assert first is not None and first.module == "transformer.h.2.mlp.c_fc"
    assert comparison.origins == [first]
    assert all(row.status == Status.MATCH for row in comparison.rows[:first.position])
    assert comparison.rows[first.position - 1].status == Status.MATCH
    # The plain computation of that Linear (HF's Conv1D: addmm) on its input, with either weight.
    seen = []
    hook = model.transformer.h[2].mlp.c_fc.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    with torch.no_grad():
        model(ids)
    hook.remove()
    layer, x = model.transformer.h[2].mlp.c_fc, seen[0].reshape(-1, 32)
    plain_a = torch.addmm(layer.bias, x, layer.weight).detach()
    plain_b = torch.addmm(layer.bias, x, changed.transformer.h[2].mlp.c_fc.weight).detach()
    assert first.local == pytest.approx(difference(plain_a, plain_b), rel=1e-6)
    assert first.local.max_abs == pytest.approx(float((plain_b - plain_a).abs().max()), rel=1e-6)
    assert first.diff == pytest.approx(first.local, rel=1e-6)  # its parents match: all of it is its own
    assert comparison.adding_most(1) == [first]


def test_bf16_autocast_against_fp32(gpt2, fp32_run) -> None:
    model, ids = gpt2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = torchlog.log_forward_pass(model, ids, save_function_args=True)
    comparison = torchlog.compare(fp32_run, autocast)
    # Aligned: every pass of a pairs; what only b ran (casts autocast inserts) is a cast.
    assert comparison.counts["only_a"] == 0
    assert all(row.func_name in CASTS for row in comparison if row.status == Status.ONLY_B)
    bf16_rows = [row for row in comparison if row.dtype_b == torch.bfloat16 and row.dtype_a == torch.float32]
    assert len(bf16_rows) > 30
    # No op whose paired inputs all match differs under the default tolerances.
    by_label = {row.label_a: row for row in comparison if row.label_a is not None}
    for row in comparison:
        if row.status == Status.DIFFERS:
            parents = [by_label[p] for p in fp32_run[row.label_a].parent_labels if p in by_label]
            assert any(p.status != Status.MATCH for p in parents), row
    assert comparison.origins == [] and comparison.counts["match"] > 0.9 * len(fp32_run)
    # The local-error column is filled, and bf16-sized where the op ran in bf16.
    compared = [row for row in comparison if row.status in (Status.MATCH, Status.DIFFERS)
                and can_rerun(autocast[row.label_b])]
    assert len(compared) > 100 and all(row.local is not None for row in compared)
    assert not comparison.local_failures
    first_matmul = next(row for row in bf16_rows if row.func_name == "addmm")
    assert 1e-4 < first_matmul.local.rel_l2 < 1e-2
    # ... equal to the plain bf16 computation of that op on a's input.
    parent = fp32_run[first_matmul.label_a].parent_labels
    layer = model.transformer.h[0].attn.c_attn
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = torch.addmm(layer.bias, fp32_run[parent[0]].tensor_contents, layer.weight).detach()
    expected = difference(fp32_run[first_matmul.label_a].tensor_contents, plain)
    assert first_matmul.local == pytest.approx(expected, rel=1e-6)


# ----- eager attention: an additive mask holding float32's lowest value -------------------------
FMIN = torch.finfo(torch.float32).min


@pytest.fixture(scope="module")
def eager_gpt2() -> tuple[torch.nn.Module, torch.Tensor, torchlog.ModelHistory]:
    """GPT-2 whose attention adds Hugging Face's mask (0 where a token may look, float32's
    lowest value where not) to its scores, and its float32 run."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=SEQ,
                                     bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    model, ids = transformers.GPT2LMHeadModel(config).eval(), torch.randint(0, 100, (1, SEQ))
    return model, ids, torchlog.log_forward_pass(model, ids)


def _mask_adds(comparison, a: torchlog.ModelHistory) -> list:
    """The rows of the adds whose value in run a holds the mask's lowest value."""
    rows = [row for row in comparison if row.func_name == "add" and row.diff is not None
            and bool((a[row.label_a].tensor_contents == FMIN).any())]
    assert len(rows) == 2  # one per block
    return rows


def _check_against_numpy(comparison, a: torchlog.ModelHistory, b: torchlog.ModelHistory) -> None:
    """Every compared row's figures against numpy in float64 on the two saved values."""
    for row in comparison:
        if row.diff is not None:
            want = numpy_figures(a[row.label_a].tensor_contents, b[row.label_b].tensor_contents)
            assert_figures(row.diff, want)


def test_eager_attention_mask_under_bf16_autocast(eager_gpt2, tmp_path) -> None:
    model, ids, fp32_run = eager_gpt2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = torchlog.log_forward_pass(model, ids, save_function_args=True)
    comparison = torchlog.compare(fp32_run, autocast)
    for row in _mask_adds(comparison, fp32_run):  # the scores' bf16 rounding, not inf
        assert 1e-5 < row.diff.max_abs < 1e-2 and row.status == Status.MATCH, row
        assert row.local is not None and math.isfinite(row.local.max_abs)
    _check_against_numpy(comparison, fp32_run, autocast)
    assert comparison.first_divergence is None and comparison.origins == []
    data = embedded_data(comparison.to_html(str(tmp_path / "bf16.html")))
    for row in _mask_adds(comparison, fp32_run):
        sections = sections_of(data, row.label_a)
        table = sections["difference a - b (float32)"]
        assert table["Inf"] == 0 and table["NaN"] == 0
        assert max(-table["min"], table["max"]) == pytest.approx(row.diff.max_abs, rel=1e-6)
        assert sections["comparison"]["max |a - b|"] == pytest.approx(row.diff.max_abs, rel=1e-6)


def test_eager_attention_mask_after_a_nudged_attention_weight(eager_gpt2) -> None:
    model, ids, fp32_run = eager_gpt2
    changed = copy.deepcopy(model)
    with torch.no_grad():
        changed.transformer.h[0].attn.c_attn.weight[0, 0] += 1e-3
    b = torchlog.log_forward_pass(changed, ids, save_function_args=True)
    comparison = torchlog.compare(fp32_run, b)
    first = comparison.first_divergence
    assert first is not None and first.module == "transformer.h.0.attn.c_attn"
    assert first.func_name == "addmm" and comparison.origins == [first]
    assert all(math.isfinite(row.diff.max_abs) for row in comparison if row.diff is not None)
    scores = {row.label_a: row for row in comparison}
    for row in _mask_adds(comparison, fp32_run):  # what the scores moved, not inf
        parent = next(label for label in fp32_run[row.label_a].parent_labels
                      if not bool((fp32_run[label].tensor_contents == FMIN).any()))
        assert row.diff.max_abs <= scores[parent].diff.max_abs * (1 + 1e-6)
    _check_against_numpy(comparison, fp32_run, b)
