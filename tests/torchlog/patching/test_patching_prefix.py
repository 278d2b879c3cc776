"""Tests of torchlog/patching/prefix.py: calls upstream of a patch served from a recorded run.

Each served run is compared with a plain forward that patches the same value with a forward
hook (no prefix, no torchlog mode), in models that write intermediate values in place, read
Python numbers that change between runs, have parameters changed between runs, or draw
random numbers; and the sweep's runs that would write the values already there are counted.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from torchlog import log_forward_pass, select
from torchlog.patching import prefix as prefix_module
from torchlog.patching import sweep
from torchlog.patching.prefix import Prefix
from torchlog.patching.runs import Edit, run_patched
from torchlog.patching.sweep_setup import find_targets, prepare_sweep


class Residual(nn.Module):
    """Blocks on a residual stream that is added to in place, and a Python-number scale."""

    def __init__(self, hidden: int = 5, blocks: int = 3, inplace: bool = True) -> None:
        super().__init__()
        self.embed = nn.Linear(3, hidden)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh()) for _ in range(blocks))
        self.head = nn.Linear(hidden, 2)
        self.inplace = inplace
        self.scale = 1.0

    def forward(self, x):
        h = self.embed(x) * self.scale
        for block in self.blocks:
            if self.inplace:
                h += block(h)
            else:
                h = h + block(h)
        return self.head(h)


def _model(inplace: bool = True) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return Residual(inplace=inplace).eval(), torch.randn(2, 4, 3), torch.randn(2, 4, 3)


def _write(value: torch.Tensor):
    return lambda old: value.clone()


def _oracle(model: nn.Module, x: torch.Tensor, address: str, value: torch.Tensor) -> torch.Tensor:
    """A plain forward whose forward hook on `address` returns `value` instead."""
    handle = model.get_submodule(address).register_forward_hook(lambda m, a, out: value.clone())
    try:
        with torch.no_grad():
            return model(x)
    finally:
        handle.remove()


def _patched(model: nn.Module, x: torch.Tensor, address: str, value: torch.Tensor, prefix: Prefix) -> torch.Tensor:
    history = log_forward_pass(model, x, layers_to_save=None, random_seed=0)
    (target,) = find_targets(history, [address])
    with torch.no_grad():
        return run_patched(model, (x,), {}, [Edit(target, _write(value))], dict(model.named_modules()), prefix)


@pytest.mark.parametrize("inplace", [False, True])
def test_a_served_run_equals_a_plain_forward_with_the_same_patch(inplace) -> None:
    model, x, _ = _model(inplace)
    value = torch.randn(2, 4, 5)
    prefix = Prefix()
    for address in ["blocks.2", "blocks.1", "blocks.0", "blocks.2"]:  # the first run records
        got = _patched(model, x, address, value, prefix)
        assert torch.equal(got, _oracle(model, x, address, value)), address
    assert prefix.records is not None
    if not inplace:  # a stream written in place is recomputed, never served
        assert prefix.num_served > 0


def test_a_python_number_that_changed_is_not_served_stale() -> None:
    model, x, _ = _model(inplace=False)
    value = torch.randn(2, 4, 5)
    prefix = Prefix()
    _patched(model, x, "blocks.2", value, prefix)
    model.scale = 3.0
    assert torch.equal(_patched(model, x, "blocks.1", value, prefix), _oracle(model, x, "blocks.1", value))


def test_a_parameter_changed_in_place_is_not_served_stale() -> None:
    model, x, _ = _model(inplace=False)
    value = torch.randn(2, 4, 5)
    prefix = Prefix()
    _patched(model, x, "blocks.2", value, prefix)
    with torch.no_grad():
        model.blocks[0][0].weight.mul_(-1.0)
    assert torch.equal(_patched(model, x, "blocks.1", value, prefix), _oracle(model, x, "blocks.1", value))


def test_a_run_that_draws_random_numbers_records_nothing() -> None:
    model, x, _ = _model(inplace=False)
    model.blocks[0].append(nn.Dropout(0.5))
    model.train()
    prefix = Prefix()
    _patched(model, x, "blocks.2", torch.randn(2, 4, 5), prefix)
    assert prefix.records is None


def test_recording_stops_at_its_byte_budget_and_runs_stay_right(monkeypatch) -> None:
    model, x, _ = _model(inplace=False)
    monkeypatch.setattr(prefix_module, "MAX_RECORDED_BYTES", 400)
    value = torch.randn(2, 4, 5)
    prefix = Prefix()
    _patched(model, x, "blocks.2", value, prefix)
    assert prefix.records is not None and sum(
        r[3].numel() * r[3].element_size() for r in prefix.records if isinstance(r[3], torch.Tensor)) <= 400
    assert torch.equal(_patched(model, x, "blocks.1", value, prefix), _oracle(model, x, "blocks.1", value))


def _hooked(model: nn.Module, x: torch.Tensor, address: str, fn) -> torch.Tensor:
    handle = model.get_submodule(address).register_forward_hook(lambda m, a, out: fn(out))
    try:
        with torch.no_grad():
            return model(x)
    finally:
        handle.remove()


@pytest.mark.parametrize("batch_size", [None, 2])
def test_a_sweep_with_a_stream_written_in_place_equals_hooked_forwards(batch_size) -> None:
    model, clean, corrupted = _model(inplace=True)
    result = sweep(model, clean, corrupted, select.module_type("Sequential"), lambda out: out[..., 0].sum(),
                   positions=[0, 3], batch_size=batch_size, progress=False)
    assert len(result) == 6
    for row in result:
        seen = {}
        _hooked(model, clean, row.module, lambda out: seen.setdefault("v", out.clone()))

        def patch(out, p=row.position):
            new = out.clone()
            new[:, p] = seen["v"][:, p]
            return new

        want = float(_hooked(model, corrupted, row.module, patch)[..., 0].sum())
        assert row.metric == pytest.approx(want, rel=1e-5, abs=1e-6), (row.module, row.position)


def _model_calls(model: nn.Module, run) -> int:
    calls = []
    handle = model.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        run()
    finally:
        handle.remove()
    return len(calls)


def test_patches_that_write_the_values_already_there_are_not_run() -> None:
    # The blocks act on each position alone, so where the inputs agree (every position but
    # 2), the clean and corrupted values agree at every block: those patches change nothing.
    model, clean, _ = _model(inplace=False)
    corrupted = clean.clone()
    corrupted[:, 2] += 1.0
    sites, metric = select.module_type("Sequential"), lambda out: out.sum()
    setup_calls = _model_calls(model, lambda: prepare_sweep(model, clean, corrupted, [sites], metric, None))
    found = []
    calls = _model_calls(model, lambda: found.append(sweep(model, clean, corrupted, sites, metric,
                                                           positions=[0, 1, 2, 3], progress=False)))
    assert calls == setup_calls + 3  # one run per block, at position 2
    (result,) = found
    with torch.no_grad():
        assert result.corrupted_metric == pytest.approx(float(model(corrupted).sum()), rel=1e-6)
    for row in result:
        if row.position != 2:
            assert row.metric == result.corrupted_metric and row.effect == 0.0
        else:
            assert row.effect != 0.0


def test_a_model_that_draws_random_numbers_runs_every_patch() -> None:
    model, clean, _ = _model(inplace=False)
    model.head = nn.Sequential(nn.Dropout(0.5), model.head)  # after the sites: their values still agree
    model.train()
    corrupted = clean.clone()
    corrupted[:, 2] += 1.0
    metric = lambda out: out.sum()  # noqa: E731
    setup_calls = _model_calls(model, lambda: prepare_sweep(model, clean, corrupted, ["blocks.1"], metric, None))
    calls = _model_calls(model, lambda: sweep(model, clean, corrupted, ["blocks.1"], metric, positions=[0, 1],
                                              progress=False))
    assert calls == setup_calls + 2
