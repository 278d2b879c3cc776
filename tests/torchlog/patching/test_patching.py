"""Tests of torchlog/patching: sweeps and attribution against plain forwards with patching hooks."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlog
from tests.state_snapshot import differences, take
from torchlog import select
from torchlog.errors import InterventionError, InvalidArgumentTypeError, InvalidOptionError
from torchlog.patching import attribution, sweep


class Tokens(nn.Module):
    """A small position-wise model (batch, tokens, hidden) with a residual stream: rows and
    positions are independent, blocks are modules, and one op (the `* 0.5`) is no module's output."""

    def __init__(self, hidden: int = 6, blocks: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(4, hidden)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh()) for _ in range(blocks))
        self.head = nn.Linear(hidden, 2)

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = h + block(h) * 0.5
        return self.head(h)


def _metric(out):
    return out[:, -1, 0].sum() - out[:, -1, 1].sum()


def _setup():
    torch.manual_seed(0)
    return Tokens().eval(), torch.randn(1, 5, 4), torch.randn(1, 5, 4)


def _hooked_metric(model, corrupted, address, value, position=None):
    """The oracle: a plain forward whose forward hook on `address` writes the clean value in."""
    def hook(module, args, out):
        new = out.clone()
        if position is None:
            new[...] = value
        else:
            new[:, position] = value[:, position]
        return new

    handle = model.get_submodule(address).register_forward_hook(hook)
    try:
        with torch.no_grad():
            return float(_metric(model(corrupted)))
    finally:
        handle.remove()


def _clean_output(model, x, address):
    seen = {}
    handle = model.get_submodule(address).register_forward_hook(lambda m, a, out: seen.setdefault("v", out.detach().clone()))
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    return seen["v"]


@pytest.mark.parametrize("batch_size", [None, 4])
def test_a_block_sweep_equals_plain_forwards_with_a_patching_hook(batch_size) -> None:
    model, clean, corrupted = _setup()
    before = take(model)
    result = sweep(model, clean, corrupted, select.module_type("Sequential"), _metric,
                   batch_size=batch_size, progress=False)
    assert differences(before, take(model)) == []
    assert len(result) == 3
    with torch.no_grad():
        clean_m, corrupted_m = float(_metric(model(clean))), float(_metric(model(corrupted)))
    assert result.clean_metric == pytest.approx(clean_m) and result.corrupted_metric == pytest.approx(corrupted_m)
    for row, k in zip(result, range(3)):
        address = f"blocks.{k}"
        want = _hooked_metric(model, corrupted, address, _clean_output(model, clean, address))
        assert row.metric == pytest.approx(want, rel=1e-5, abs=1e-6), address
        assert row.effect == pytest.approx((want - corrupted_m) / (clean_m - corrupted_m), rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("batch_size", [None, 3])
def test_positions_patch_one_token_at_a_time(batch_size) -> None:
    model, clean, corrupted = _setup()
    result = sweep(model, clean, corrupted, ["blocks.1"], _metric, positions=[0, 2, 4], batch_size=batch_size,
                   progress=False)
    assert [row.position for row in result] == [0, 2, 4]
    value = _clean_output(model, clean, "blocks.1")
    for row in result:
        assert row.metric == pytest.approx(_hooked_metric(model, corrupted, "blocks.1", value, row.position), rel=1e-5, abs=1e-6)
    # Position-wise model: only the last position can move the metric, which reads the last token.
    assert result[0].effect == pytest.approx(0.0, abs=1e-6) and result[2].effect != pytest.approx(0.0, abs=1e-6)


def test_batched_and_unbatched_sweeps_give_equal_tables() -> None:
    model, clean, corrupted = _setup()
    sites = [select.func("mul"), "blocks.0", "linear_1_1"]
    one = sweep(model, clean, corrupted, sites, _metric, positions=[1, 4], progress=False)
    many = sweep(model, clean, corrupted, sites, _metric, positions=[1, 4], batch_size=5, progress=False)
    assert [(r.label, r.position) for r in one] == [(r.label, r.position) for r in many]
    for a, b in zip(one, many):
        assert a.metric == pytest.approx(b.metric, rel=1e-5, abs=1e-6)


def test_an_op_that_is_no_module_output_is_patched_through_the_lean_capture() -> None:
    model, clean, corrupted = _setup()
    result = sweep(model, clean, corrupted, select.func("mul"), _metric, progress=False)
    assert [r.label for r in result] == ["mul_1_4", "mul_2_8", "mul_3_12"]
    clean_h = torchlog.log_forward_pass(model, clean)
    for row in result:  # oracle: the intervened log (its own capture path) patching the same op
        patched = torchlog.log_forward_pass(model, corrupted, intervene={row.label: clean_h[row.label].tensor_contents})
        assert row.metric == pytest.approx(float(_metric(patched[-1].tensor_contents)), rel=1e-6, abs=1e-7)


def test_patching_the_last_block_fully_gives_the_clean_metric() -> None:
    model, clean, corrupted = _setup()
    (row,) = sweep(model, clean, corrupted, ["add_3_13"], _metric, progress=False)  # the residual after block 3
    assert row.effect == pytest.approx(1.0, rel=1e-6)


def test_attribution_equals_the_sweep_on_a_linear_model() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 3))
    clean, corrupted = torch.randn(2, 4), torch.randn(2, 4)

    def metric(out):
        return out[:, 0].sum() - out[:, 2].sum()

    sites = ["0", "1", "2"]
    exact = sweep(model, clean, corrupted, sites, metric, progress=False)
    estimate = attribution(model, clean, corrupted, sites, metric)
    for a, b in zip(exact, estimate):
        assert a.label == b.label
        assert a.metric == pytest.approx(b.metric, rel=1e-5, abs=1e-5)


def test_attribution_leaves_parameter_gradients_alone_and_works_on_a_frozen_model() -> None:
    model, clean, corrupted = _setup()
    for p in model.parameters():
        p.requires_grad_(False)
    before = take(model)
    result = attribution(model, clean, corrupted, select.module_type("Sequential"), _metric, positions=[4])
    assert differences(before, take(model)) == []
    assert all(p.grad is None for p in model.parameters())
    assert any(abs(row.effect) > 1e-4 for row in result)


def test_result_table_top_and_pandas() -> None:
    model, clean, corrupted = _setup()
    result = sweep(model, clean, corrupted, select.module_type("Sequential"), _metric, positions=[3, 4], progress=False)
    top = result.top(2)
    assert all(abs(top[0].effect) >= abs(r.effect) for r in result) and len(top) == 2
    pytest.importorskip("pandas")
    frame = result.to_pandas()
    assert list(frame.columns) == ["site", "label", "module", "position", "metric", "effect"]
    assert len(frame) == 6 and set(frame["module"]) == {"blocks.0", "blocks.1", "blocks.2"}
    assert "largest effects" in str(result)


# ----- bad input -------------------------------------------------------------------------------
def test_a_metric_that_returns_no_number_is_named() -> None:
    model, clean, corrupted = _setup()
    with pytest.raises(InvalidArgumentTypeError, match=r"(?s)metric\(clean output\) gave .* a metric must return a number"):
        sweep(model, clean, corrupted, ["blocks.0"], lambda out: out, progress=False)


def test_positions_out_of_range_are_named() -> None:
    model, clean, corrupted = _setup()
    with pytest.raises(InvalidOptionError, match=r"position 5 is out of range for site 'blocks.0'.*\(1, 5, 6\)"):
        sweep(model, clean, corrupted, ["blocks.0"], _metric, positions=[5], progress=False)


def test_inputs_whose_runs_differ_at_a_site_are_refused() -> None:
    model, clean, _ = _setup()
    with pytest.raises(InterventionError, match=r"site 'blocks.1'.*shape \(1, 5, 6\) in the clean run and \(1, 6, 6\) in the corrupted"):
        sweep(model, clean, torch.randn(1, 6, 4), ["blocks.1"], _metric, progress=False)

    class Branches(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            h = torch.relu(x) if x.sum() > 0 else torch.sigmoid(x)
            return self.fc(h)

    with pytest.raises(InterventionError, match=r"before site 'fc': call 3 is 'relu' in the clean run and 'sigmoid'"):
        sweep(Branches(), torch.ones(1, 3), -torch.ones(1, 3), ["fc"], lambda out: out.sum(), progress=False)


def test_a_site_that_matches_nothing_is_an_error() -> None:
    model, clean, corrupted = _setup()
    with pytest.raises(InterventionError, match=r"site 'blocks.9' matches no pass"):
        sweep(model, clean, corrupted, ["blocks.9"], _metric, progress=False)


def test_a_metric_that_raises_leaves_the_model_as_it_was() -> None:
    model, clean, corrupted = _setup()
    before = take(model)
    calls = []

    def flaky(out):
        calls.append(1)
        if len(calls) > 2:
            raise RuntimeError("metric failed")
        return _metric(out)

    with pytest.raises(RuntimeError, match="metric failed"):
        sweep(model, clean, corrupted, select.module_type("Sequential"), flaky, progress=False)
    assert differences(before, take(model)) == []
    assert torch._C._len_torch_function_stack() == 0


def test_to_html_colours_the_clean_run_by_effect(tmp_path) -> None:
    import json
    import re

    model, clean, corrupted = _setup()
    result = sweep(model, clean, corrupted, select.module_type("Sequential"), _metric, positions=[4], progress=False)
    page = result.to_html(str(tmp_path / "effects.html"))
    text = open(page, encoding="utf-8").read()
    assert "sweep effect (0 corrupted, 1 clean)" in text
    for row in result:  # each patched pass carries its effect on the page
        assert re.search(re.escape(json.dumps(row.label)), text), row.label


def test_a_sweep_by_replay_equals_the_sweep_by_rerun() -> None:
    model, clean, corrupted = _setup()
    sites = [select.module_type("Sequential"), select.func("mul")]
    rerun = sweep(model, clean, corrupted, sites, _metric, positions=[2, 4], progress=False)
    replayed = sweep(model, clean, corrupted, sites, _metric, positions=[2, 4], progress=False, engine="replay")
    assert [(r.label, r.position) for r in rerun] == [(r.label, r.position) for r in replayed]
    for a, b in zip(rerun, replayed):
        assert a.metric == pytest.approx(b.metric, rel=1e-6, abs=1e-7), a.label
    with pytest.raises(InvalidOptionError, match=r"engine must be 'rerun' or 'replay', got 'fast'"):
        sweep(model, clean, corrupted, sites, _metric, engine="fast")


@pytest.mark.parametrize("method", [sweep, attribution])
def test_equal_clean_and_corrupted_metrics_are_refused_naming_both(method) -> None:
    # The normalised effect divides by clean - corrupted: with equal metrics every row
    # would be NaN, so the sweep refuses before running any patch.
    model, clean, _ = _setup()
    with pytest.raises(InvalidOptionError, match=r"metric gives (-?\d\S*) on the clean output and \1 on "
                                                r"the corrupted one: they are equal") as raised:
        method(model, clean, clean.clone(), ["blocks.0"], _metric)
    with torch.no_grad():
        assert float(raised.value.args[0].split()[2]) == pytest.approx(float(_metric(model(clean))), abs=1e-6)
    # A metric blind to the input (a constant of the output's dtype): both values are 0.0.
    with pytest.raises(InvalidOptionError, match=r"0\.0 on the clean output and 0\.0 on the corrupted one"):
        method(model, clean, torch.randn(1, 5, 4), ["blocks.0"], lambda out: out.sum() * 0)


def test_a_metric_that_is_not_finite_is_refused_naming_both() -> None:
    model, clean, corrupted = _setup()
    with pytest.raises(InvalidOptionError, match=r"metric gives nan on the clean output and nan .*finite"):
        sweep(model, clean, corrupted, ["blocks.0"], lambda out: out.sum() * float("nan"), progress=False)


class WritesOut(nn.Module):
    """Writes its add into a tensor it made (`out=`) and reads that tensor, not the add's result."""

    def forward(self, x):
        c = torch.empty(3)
        torch.add(x, 1, out=c)
        return c * 2


@pytest.mark.parametrize("batch_size", [None, 2])
def test_a_sweep_over_an_out_argument_op_patches_what_the_model_reads(batch_size) -> None:
    """The whole difference between the inputs passes through the add, so patching it in
    restores the clean metric: effect 1 (it was reported as 0 when the lean capture swapped
    only the returned value and the model read the unedited `out=` tensor)."""
    clean, corrupted = torch.ones(3), torch.full((3,), 5.0)
    history = torchlog.log_forward_pass(WritesOut(), clean)
    add = next(p.label for p in history.passes if p.func_name == "add")
    keywords = {} if batch_size is None else {"batch_size": batch_size}
    result = sweep(WritesOut(), clean, corrupted, [add], lambda out: out.sum(), **keywords)
    assert [row.effect for row in result] == [pytest.approx(1.0)]
