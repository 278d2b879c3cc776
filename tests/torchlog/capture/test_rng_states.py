"""RNG states recorded for replay (capture/rng.py): CPU states shared while unchanged, the
(cpu, device, cuda) form for ops on CUDA, restoring both, and storing them without pickling."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlog
from tests.models import TINY_MODELS
from torchlog.capture.rng import cuda_device_of, rng_restored, rng_state
from torchlog.validation import find_replay_problems

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU: torch.cuda.is_available() is False here")


def test_cpu_state_is_shared_until_a_number_is_drawn() -> None:
    first = rng_state(None, (torch.ones(2),), {})
    assert isinstance(first, torch.Tensor) and torch.equal(first, torch.get_rng_state())
    assert rng_state(first, (torch.ones(2),), {}) is first
    torch.rand(1)
    after = rng_state(first)
    assert after is not first and torch.equal(after, torch.get_rng_state())


def test_a_cpu_op_after_a_cuda_op_shares_the_cpu_part() -> None:
    cpu = torch.get_rng_state()
    last = (cpu, 0, torch.zeros(16, dtype=torch.uint8))
    assert rng_state(last, (torch.ones(1),), {}) is cpu


@pytest.mark.skipif(torch.cuda.is_initialized(), reason="CUDA is initialized in this process")
def test_no_cuda_state_is_read_before_cuda_is_initialized() -> None:
    # Reading it would initialize CUDA, or fail before the op where there is none.
    assert cuda_device_of((torch.ones(1),), {"device": "cuda"}) is None
    assert isinstance(rng_state(None, (), {"device": "cuda"}), torch.Tensor)
    assert not torch.cuda.is_initialized()


def test_restoring_a_cpu_state_replays_a_draw_and_puts_the_state_back() -> None:
    state = torch.get_rng_state()
    expected = torch.rand(3)
    before = torch.get_rng_state()
    with rng_restored(state):
        assert torch.equal(torch.rand(3), expected)
    assert torch.equal(torch.get_rng_state(), before)
    with rng_restored(None):
        assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_restoring_a_cuda_state_without_cuda_restores_the_cpu_part() -> None:
    state = (torch.get_rng_state(), 0, torch.zeros(16, dtype=torch.uint8))
    expected = torch.rand(3)
    with rng_restored(state):
        assert torch.equal(torch.rand(3), expected)


def test_cpu_replay_records_plain_cpu_states() -> None:
    make_model, make_input = TINY_MODELS["train_eval"]
    history = torchlog.log_forward_pass(make_model(), make_input(), save_function_args=True,
                                        detach_saved_tensors=True, random_seed=0)
    states = [p.rng_state for p in history if p.rng_state is not None]
    assert states and all(isinstance(s, torch.Tensor) for s in states)
    assert not find_replay_problems(history).problems


def test_cuda_form_of_a_state_stores_and_loads_without_pickle(tmp_path) -> None:
    pytest.importorskip("h5py")
    make_model, make_input = TINY_MODELS["train_eval"]
    history = torchlog.log_forward_pass(make_model(), make_input(), save_function_args=True,
                                        random_seed=0)
    record = next(p for p in history if p.rng_state is not None)
    cuda = torch.arange(16, dtype=torch.uint8)
    record.rng_state = (record.rng_state, 1, cuda)  # as an op on cuda:1 records it
    path = str(tmp_path / "run.h5")
    history.save(path)
    loaded = torchlog.load(path)[record.label].rng_state
    assert type(loaded) is tuple and len(loaded) == 3
    assert torch.equal(loaded[0], record.rng_state[0]) and loaded[1] == 1 and torch.equal(loaded[2], cuda)


# ----- on a GPU ------------------------------------------------------------------------------
@pytest.mark.cuda
@needs_cuda
def test_cuda_ops_record_their_device_state_and_share_it_while_unchanged() -> None:
    x = torch.ones(2, device="cuda")
    device = x.get_device()
    first = rng_state(None, (x,), {})
    assert type(first) is tuple and first[1] == device
    assert torch.equal(first[2], torch.cuda.get_rng_state(device))
    assert rng_state(first, (x,), {}) is first
    torch.rand(3, device="cuda")
    assert rng_state(first, (x,), {}) is not first
    assert cuda_device_of((), {"device": "cuda"}) == torch.cuda.current_device()
    assert cuda_device_of(([torch.ones(1), x],), {}) == device
    assert cuda_device_of((torch.ones(1),), {"device": "cpu"}) is None


@pytest.mark.cuda
@needs_cuda
def test_restoring_a_cuda_state_replays_a_cuda_draw() -> None:
    state = rng_state(None, (), {"device": "cuda"})
    expected = torch.rand(5, device="cuda")
    after = torch.cuda.get_rng_state()
    with rng_restored(state):
        assert torch.equal(torch.rand(5, device="cuda"), expected)
    assert torch.equal(torch.cuda.get_rng_state(), after)


@pytest.mark.cuda
@needs_cuda
def test_cuda_dropout_model_validates() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.ReLU()).cuda().train()
    x = torch.randn(4, 8, device="cuda")
    assert torchlog.validate_saved_activations(model, x, random_seed=0)
