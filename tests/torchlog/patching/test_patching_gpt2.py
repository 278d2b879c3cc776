"""Patching sweeps on a transformers GPT-2 (tiny, built from a config, no downloads) against
plain PyTorch: each row's metric equals a plain forward whose hook writes the clean value (taken
by a hook on a plain clean run) into the same site; batched and unbatched sweeps agree; the
model and torch are as they were afterwards, also when the metric raises midway.
"""
from __future__ import annotations

import math

import pytest
import torch
import transformers

import torchlog
from tests.state_snapshot import differences, take
from torchlog import select
from torchlog.patching import attribution, sweep

pytestmark = pytest.mark.heavy

SEQ, CHANGED = 6, 2  # prompt length; the position where the prompts differ
POSITIONS = [1, CHANGED, SEQ - 1]  # a sample: before, at and after the changed token
KWARGS = {"use_cache": False}
BLOCKS = select.module_type("GPT2Block")
# Ops whose innermost module is block 1 itself: its two residual adds. The first one (after
# attention) is no module's output, so it is patched through the lean capture; the second
# is the block's output (a forward hook).
RESIDUAL_ADDS = select.func("add") & select.where(lambda op: op.module == "transformer.h.1")


@pytest.fixture(scope="module")
def gpt2() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """The model and two prompts that differ at position CHANGED only."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=3, n_embd=32, n_head=4, vocab_size=100, n_positions=SEQ,
                                     bos_token_id=0, eos_token_id=0, initializer_range=0.2,
                                     attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(config).eval()
    clean = torch.randint(0, 100, (1, SEQ))
    corrupted = clean.clone()
    corrupted[0, CHANGED] = (clean[0, CHANGED] + 1) % 100
    return model, clean, corrupted


def metric(out) -> torch.Tensor:
    """A logit difference at the last position."""
    return out.logits[0, -1, 3] - out.logits[0, -1, 7]


def _clean_values(model: torch.nn.Module, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Plain clean run: every block's output by address, and block 1's first residual add
    (the input of its ln_2) under 'mid'."""
    seen: dict[str, torch.Tensor] = {}
    handles = [model.get_submodule(f"transformer.h.{k}").register_forward_hook(
        lambda m, a, out, k=k: seen.setdefault(f"transformer.h.{k}", out.detach().clone())) for k in range(3)]
    handles.append(model.get_submodule("transformer.h.1.ln_2").register_forward_pre_hook(
        lambda m, args: seen.setdefault("mid", args[0].detach().clone())))
    try:
        with torch.no_grad():
            model(ids, **KWARGS)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _index(position: int | None) -> tuple:
    return (...,) if position is None else (slice(None), position)


def _hooked_metric(model: torch.nn.Module, ids: torch.Tensor, site: str, value: torch.Tensor,
                   position: int | None) -> float:
    """The oracle: a plain forward that writes `value` (at `position`) into `site`: a block's
    output by a forward hook, or ('mid') block 1's first residual add, by writing in place
    into the tensor ln_2 receives, which is the add's output that the second add reads too."""
    index = _index(position)

    def on_output(module, args, out):
        new = out.clone()
        new[index] = value[index]
        return new

    def on_input(module, args):
        args[0][index] = value[index]

    if site == "mid":
        handle = model.get_submodule("transformer.h.1.ln_2").register_forward_pre_hook(on_input)
    else:
        handle = model.get_submodule(site).register_forward_hook(on_output)
    try:
        with torch.no_grad():
            return float(metric(model(ids, **KWARGS)))
    finally:
        handle.remove()


def _plain_metric(model: torch.nn.Module, ids: torch.Tensor) -> float:
    with torch.no_grad():
        return float(metric(model(ids, **KWARGS)))


@pytest.fixture(scope="module")
def labels(gpt2) -> tuple[list[str], str]:
    """From a logged clean run: the blocks' output passes, and block 1's first residual add."""
    model, clean, _ = gpt2
    history = torchlog.log_forward_pass(model, clean, input_kwargs=KWARGS, layers_to_save=None)
    block_outputs = [history.modules[f"transformer.h.{k}"].call_outputs[0][0] for k in range(3)]
    adds = [label for label in history.modules["transformer.h.1"].call_layers[0]
            if history[label].func_name in ("add", "__add__")
            and history[label].containing_modules[0] == "transformer.h.1:1"]
    assert len(adds) == 2 and adds[1] == block_outputs[1]
    assert history[adds[0]].output_of_modules == ()  # no module's output: the lean path
    return block_outputs, adds[0]


@pytest.fixture(scope="module")
def unbatched(gpt2):
    model, clean, corrupted = gpt2
    before = take(model)
    result = sweep(model, clean, corrupted, [BLOCKS, RESIDUAL_ADDS], metric, positions=POSITIONS,
                   input_kwargs=KWARGS, progress=False)
    return result, differences(before, take(model))


def test_rows_are_the_block_outputs_and_the_residual_add_at_each_position(unbatched, labels) -> None:
    result, _ = unbatched
    block_outputs, mid = labels
    # The selector's second match (block 1's output) is already a row of the first site.
    want = [(label, p) for label in block_outputs + [mid] for p in POSITIONS]
    assert [(row.label, row.position) for row in result] == want
    assert [row.module for row in result[::3]] == ["transformer.h.0", "transformer.h.1", "transformer.h.2",
                                                   "transformer.h.1"]


def test_each_row_equals_a_plain_forward_with_a_patching_hook(gpt2, unbatched, labels) -> None:
    model, clean, corrupted = gpt2
    result, _ = unbatched
    _, mid = labels
    values = _clean_values(model, clean)
    clean_m, corrupted_m = _plain_metric(model, clean), _plain_metric(model, corrupted)
    assert result.clean_metric == pytest.approx(clean_m, rel=1e-6, abs=1e-6)
    assert result.corrupted_metric == pytest.approx(corrupted_m, rel=1e-6, abs=1e-6)
    assert abs(clean_m - corrupted_m) > 1e-3  # the changed token moves the metric
    for row in result:
        site = "mid" if row.label == mid else row.module
        want = _hooked_metric(model, corrupted, site, values[site], row.position)
        assert row.metric == pytest.approx(want, rel=1e-5, abs=1e-6), (row.label, row.position)
        assert row.effect == pytest.approx((want - corrupted_m) / (clean_m - corrupted_m), rel=1e-4, abs=1e-5)
        if row.position < CHANGED:  # the prompts agree there, and attention looks back only
            assert row.effect == pytest.approx(0.0, abs=1e-5), (row.label, row.position)


def test_whole_values_of_the_residual_add_and_the_last_block(gpt2, labels) -> None:
    model, clean, corrupted = gpt2
    result = sweep(model, clean, corrupted, [RESIDUAL_ADDS, "transformer.h.2"], metric,
                   input_kwargs=KWARGS, progress=False)
    assert [(row.label, row.position) for row in result] == [(labels[1], None), (labels[0][1], None),
                                                             (labels[0][2], None)]
    values = _clean_values(model, clean)
    for row, site in zip(result, ["mid", "transformer.h.1", "transformer.h.2"]):
        want = _hooked_metric(model, corrupted, site, values[site], None)
        assert row.metric == pytest.approx(want, rel=1e-5, abs=1e-6), row.label
    # Everything the metric reads passes through either residual add of block 1 and the last
    # block's output: patching any of them whole gives the clean run's metric.
    assert [row.effect for row in result] == pytest.approx([1.0, 1.0, 1.0], rel=1e-4)


def test_a_batched_sweep_gives_the_unbatched_table(gpt2, unbatched) -> None:
    # GPT-2 runs one more op for a batch of several rows than for one (transformers expands
    # the position ids), so a batched run counts its ops differently from the clean run.
    model, clean, corrupted = gpt2
    one, _ = unbatched
    before = take(model)
    many = sweep(model, clean, corrupted, [BLOCKS, RESIDUAL_ADDS], metric, positions=POSITIONS,
                 batch_size=4, input_kwargs=KWARGS, progress=False)
    assert differences(before, take(model)) == []
    assert [(r.site, r.label, r.module, r.position) for r in many] == [(r.site, r.label, r.module, r.position) for r in one]
    wrong = [(a.label, a.position, a.metric, b.metric) for a, b in zip(one, many)
             if b.metric != pytest.approx(a.metric, rel=1e-5, abs=1e-6)
             or b.effect != pytest.approx(a.effect, rel=1e-4, abs=1e-5)]
    assert wrong == [], "(label, position, unbatched metric, batched metric) that differ"


def test_the_model_and_torch_are_as_they_were_after_a_sweep(unbatched) -> None:
    _, changed = unbatched
    assert changed == []


def _ranks(values: list[float]) -> torch.Tensor:
    """1-based ranks, ties sharing their average rank (here every position before the changed
    token has effect 0 in both tables)."""
    x = torch.tensor(values, dtype=torch.float64)
    below = (x[None, :] < x[:, None]).sum(1)
    equal = (x[None, :] == x[:, None]).sum(1)
    return below + (equal + 1) / 2


def _spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation: Pearson's correlation of the ranks."""
    ra, rb = (r - r.mean() for r in (_ranks(a), _ranks(b)))
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def test_attribution_has_the_sweeps_rows_and_its_rank_correlation_is_reported(gpt2) -> None:
    model, clean, corrupted = gpt2
    positions = list(range(SEQ))
    before = take(model)
    exact = sweep(model, clean, corrupted, BLOCKS, metric, positions=positions, batch_size=SEQ,
                  input_kwargs=KWARGS, progress=False)
    estimate = attribution(model, clean, corrupted, BLOCKS, metric, positions=positions, input_kwargs=KWARGS)
    assert differences(before, take(model)) == []
    assert all(p.grad is None for p in model.parameters())
    assert [(r.label, r.position) for r in estimate] == [(r.label, r.position) for r in exact]
    assert estimate.clean_metric == exact.clean_metric and estimate.corrupted_metric == exact.corrupted_metric
    rho = _spearman([r.effect for r in exact], [r.effect for r in estimate])
    print(f"attribution vs sweep over {len(exact)} block outputs x positions: Spearman rank correlation {rho:.3f}")
    assert math.isfinite(rho) and -1.0 <= rho <= 1.0
    for a, b in zip(exact, estimate):
        if a.position < CHANGED:  # clean == corrupted there: both say exactly nothing changes
            assert a.effect == pytest.approx(0.0, abs=1e-5) and b.effect == pytest.approx(0.0, abs=1e-5)


def _failing_metric(after: int):
    calls = []

    def flaky(out):
        calls.append(1)
        if len(calls) > after:
            raise RuntimeError("metric failed midway")
        return metric(out)

    return flaky


@pytest.mark.parametrize("how", ["sweep", "batched sweep", "attribution"])
def test_a_metric_that_raises_midway_leaves_the_model_untouched(gpt2, unbatched, how) -> None:
    model, clean, corrupted = gpt2
    before = take(model)
    sites = [RESIDUAL_ADDS, BLOCKS]  # the lean capture's path and forward hooks, both in use
    # A sweep's calls 1 and 2 measure the unpatched runs, its 3rd and 4th are patched runs
    # and its 5th raises; attribution's 1st measures the clean run and its 2nd, which
    # raises, is its one corrupted run, with every site's edit in place.
    with pytest.raises(RuntimeError, match="metric failed midway"):
        if how == "attribution":
            attribution(model, clean, corrupted, sites, _failing_metric(1), input_kwargs=KWARGS)
        else:
            sweep(model, clean, corrupted, sites, _failing_metric(4), positions=[CHANGED],
                  batch_size=2 if how == "batched sweep" else None, input_kwargs=KWARGS, progress=False)
    assert differences(before, take(model)) == []
    assert torch._C._len_torch_function_stack() == 0
    assert all(p.grad is None for p in model.parameters())
    assert _plain_metric(model, corrupted) == pytest.approx(unbatched[0].corrupted_metric, rel=1e-6, abs=1e-6)
