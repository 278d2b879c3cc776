"""profile=True (torchlog/capture/profile.py): bytes saved for backward per op, the CUDA peak,
gradients unchanged, hooks removed, and the figures in printout, pandas and log files."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlog
from tests.invariants import check_history
from tests.models import MultiOutput, Nested, SimpleRecurrent
from torchlog.capture.profile import OpProfiler


class Known(nn.Module):
    """Ops whose saved tensors are known: linear keeps its input (not its weight), exp its
    result, mul both operands, add nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)  # saves x: 2*4 floats
        e = y.exp()  # saves its result
        return (e * y) + 1.0  # mul saves e and y; add saves nothing


def _profiled(model, x, **options) -> torchlog.ModelHistory:
    history = torchlog.log_forward_pass(model, x, random_seed=0, profile=True, **options)
    check_history(history)
    return history


def test_saved_bytes_of_known_ops():
    history = _profiled(Known(), torch.randn(2, 4))
    saved = {p.label: p.saved_for_backward_bytes for p in history}
    assert saved == {"input_1_0": None, "linear_1_1": 32, "exp_1_2": 32, "mul_1_3": 64,
                     "add_1_4": 0, "output_1_5": None}
    assert all(p.peak_bytes is None for p in history)  # no CUDA here


def test_nothing_is_saved_without_grad():
    with torch.no_grad():
        history = _profiled(Known(), torch.randn(2, 4))
    assert [p.saved_for_backward_bytes for p in history if not p.is_input and not p.is_output] \
        == [0, 0, 0, 0]


def test_a_saved_input_that_requires_grad_counts_and_parameters_do_not():
    x = torch.randn(2, 4, requires_grad=True)
    history = _profiled(nn.Linear(4, 4, bias=False), x)
    # mm saves its input for the weight's gradient and the weight (a view) for the input's:
    # only the input counts
    assert history["linear_1_1"].saved_for_backward_bytes == 32


def test_a_multi_output_call_counts_on_its_first_output():
    history = _profiled(MultiOutput(), torch.randn(2, 4))
    lstm = [p for p in history if p.func_name == "lstm"]
    assert lstm[0].saved_for_backward_bytes > 0
    assert [p.saved_for_backward_bytes for p in lstm[1:]] == [0, 0]


def test_off_by_default():
    history = torchlog.log_forward_pass(Known(), torch.randn(2, 4))
    assert {p.saved_for_backward_bytes for p in history} == {None}
    assert {p.peak_bytes for p in history} == {None}


@pytest.mark.parametrize("model, x", [(Nested(), torch.randn(2, 4)),
                                      (SimpleRecurrent(), torch.randn(3, 5))],
                         ids=["nested", "recurrent"])
def test_gradients_are_unchanged_and_the_hooks_are_gone(model, x):
    torch.manual_seed(0)
    model(x).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    history = _profiled(model, x)
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    history[-1].tensor_contents.sum().backward()
    for got, want in zip((p.grad for p in model.parameters()), expected):
        assert torch.allclose(got, want)


def test_changing_a_saved_tensor_in_place_still_fails_backward():
    profiler = OpProfiler([])
    x = torch.randn(3, requires_grad=True)
    with profiler:  # the hooks profile=True enters around forward
        z = x.exp()  # saves its result
    with torch.no_grad():
        z.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()


def test_figures_show_in_printout_pandas_and_log_files(tmp_path):
    pytest.importorskip("pandas")
    history = _profiled(Known(), torch.randn(2, 4))
    assert "Memory: output 32 B, saved for backward 64 B" in str(history["mul_1_3"])
    frame = history.to_pandas()
    assert list(frame["saved_for_backward_bytes"])[1:5] == [32, 32, 64, 0]
    loaded = torchlog.load(history.save(str(tmp_path / "run.h5")))
    assert [p.saved_for_backward_bytes for p in loaded] == [p.saved_for_backward_bytes for p in history]


def test_partial_history_keeps_the_figures_of_what_ran():
    class Fails(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x).exp() @ torch.ones(3, 3)

    with pytest.raises(RuntimeError) as caught:
        torchlog.log_forward_pass(Fails(), torch.randn(2, 4), profile=True)
    history = caught.value.torchlog_history
    assert [p.saved_for_backward_bytes for p in history][1:3] == [32, 32]


def test_profile_must_be_a_bool():
    with pytest.raises(torchlog.InvalidArgumentTypeError, match="profile must be True or False"):
        torchlog.log_forward_pass(Known(), torch.randn(2, 4), profile="yes")


class _FakeCuda:
    """A CUDA allocator in numbers: `allocated` now and the peak since the last reset."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.allocated = self.peak = 0
        for name, value in {"is_initialized": lambda: True, "synchronize": lambda: None,
                            "memory_allocated": lambda: self.allocated,
                            "max_memory_allocated": lambda: self.peak,
                            "reset_peak_memory_stats": self.reset}.items():
            monkeypatch.setattr(torch.cuda, name, value)

    def reset(self) -> None:
        self.peak = self.allocated

    def alloc(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.peak = max(self.peak, self.allocated)


def test_cuda_peak_is_the_high_water_mark_over_the_start_nested_ops_included(monkeypatch):
    cuda = _FakeCuda(monkeypatch)
    cuda.alloc(1000)
    profiler = OpProfiler([])
    outer = profiler.start()
    cuda.alloc(300)  # the outer op allocates 300
    inner = profiler.start()
    cuda.alloc(500)
    cuda.alloc(-500)
    profiler.stop(inner, 0)
    assert profiler.last == (0, 500)  # inner: 500 over its start
    cuda.alloc(-300)
    profiler.stop(outer, 0)
    assert profiler.last == (0, 800)  # outer: 300 + the inner 500, over 1000


@pytest.mark.heavy
def test_gpt2_total_against_one_hook_over_the_whole_pass():
    """Saved tensors live until backward, so no storage address is reused during forward: one
    hook over the whole pass counts every distinct saved storage once. The per-op figures add
    up to at least that, and more only by storages that two ops both saved (here two 1 KB
    hidden states, each saved by two ops)."""
    from tests.torchlog.export.histories import gpt2

    _, model, ids = gpt2()
    history = _profiled(model, ids)
    kept = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids)
    expected = sum(nbytes for address, nbytes in seen.items() if address not in kept)
    total = sum(p.saved_for_backward_bytes or 0 for p in history)
    assert 0 < expected <= total <= expected * 1.05
