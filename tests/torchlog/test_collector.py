"""The cyclic garbage collector is off while a pass is logged and left as it was after."""
from __future__ import annotations

import gc
import threading
import weakref

import pytest
import torch
from torch import nn

import torchlog
from torchlog.collector import collector_paused


class _SeesCollector(nn.Module):
    """Notes whether the collector was on while its forward ran; raises when asked."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.fail = fail
        self.seen: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(gc.isenabled())
        if self.fail:
            raise ValueError("the model failed")
        return x + 1


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_off_during_the_pass_and_on_after(collector_on):
    model = _SeesCollector()
    torchlog.log_forward_pass(model, torch.ones(2))
    assert model.seen == [False]
    assert gc.isenabled()


def test_left_off_when_it_was_off(collector_on):
    gc.disable()
    model = _SeesCollector()
    torchlog.log_forward_pass(model, torch.ones(2))
    assert model.seen == [False] and not gc.isenabled()


def test_turned_back_on_when_forward_raises(collector_on):
    model = _SeesCollector(fail=True)
    with pytest.raises(ValueError, match="the model failed"):
        torchlog.log_forward_pass(model, torch.ones(2))
    assert model.seen == [False] and gc.isenabled()


def test_layers_to_save_runs_every_pass_paused(collector_on):
    model = _SeesCollector()
    torchlog.log_forward_pass(model, torch.ones(2), layers_to_save=["add"])  # one pass
    assert model.seen == [False] and gc.isenabled()
    torchlog.log_forward_pass(model, torch.ones(2), intervene={"add": torchlog.interventions.scale(1.0)})
    assert model.seen == [False, False, False] and gc.isenabled()  # a probe and the pass


def test_overlapping_threads_share_one_pause(collector_on):
    # Thread A enters and waits inside the pause while B enters and leaves: the collector
    # must stay off until A leaves too, then come back on.
    a_inside, b_done = threading.Event(), threading.Event()
    states: dict[str, bool] = {}

    def a() -> None:
        with collector_paused():
            a_inside.set()
            b_done.wait(timeout=30)
            states["a after b left"] = gc.isenabled()

    def b() -> None:
        a_inside.wait(timeout=30)
        with collector_paused():
            states["b inside"] = gc.isenabled()
        b_done.set()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert states == {"a after b left": False, "b inside": False}
    assert gc.isenabled()


@pytest.mark.parametrize("options", [{}, {"layers_to_save": ["relu"]}, {"save_function_args": True},
                                     {"profile": True}, {"save_gradients": True}],
                         ids=["all", "some", "function args", "profile", "gradients"])
def test_deleting_the_history_frees_its_activations_without_the_collector(collector_on, options):
    # No reference cycle may hold the recorder (whose nodes name the saved values), nor one
    # through autograd (profile's saved-tensor hooks: relu saves its output for backward):
    # with the collector off, only reference counting can free them.
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    gc.disable()
    history = torchlog.log_forward_pass(model, torch.randn(3, 4), **options)
    saved = weakref.ref(history["relu_1_2"].saved)
    assert saved() is not None
    del history
    assert saved() is None


class _RaisesAfterReLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.lin(x))
        raise ValueError(f"failed after an output of shape {tuple(y.shape)}")


def test_a_partial_history_returned_is_freed_without_the_collector(collector_on):
    # The error's traceback keeps torchlog's frames: none of them may keep the error in turn.
    gc.disable()
    history = torchlog.log_forward_pass(_RaisesAfterReLU(), torch.randn(2, 4), on_error="return")
    saved = weakref.ref(history["relu_1_2"].saved)
    del history
    assert saved() is None


def test_a_partial_history_on_the_raised_error_is_freed_with_it(collector_on):
    gc.disable()
    with pytest.raises(ValueError, match="failed after") as info:
        torchlog.log_forward_pass(_RaisesAfterReLU(), torch.randn(2, 4))
    saved = weakref.ref(info.value.torchlog_history["relu_1_2"].saved)
    del info  # the last name for the error
    assert saved() is None
