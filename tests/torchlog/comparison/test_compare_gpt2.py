"""torchlog.compare on a tiny GPT-2 (transformers, no downloads): one changed weight, and bf16 autocast."""
from __future__ import annotations

import copy

import pytest
import torch
import transformers

import torchlog
from torchlog.comparison import Status, difference
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
