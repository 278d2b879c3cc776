"""Saved values moved to output_device (capture/transfer.py): the CPU path, the ordering of the
CUDA path with fake streams and events, and on a GPU the real side-stream copies."""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

import torchlog
import torchlog.capture.recorder as recorder_module
from tests.invariants import check_history
from tests.models import TINY_MODELS
from torchlog.capture.transfer import DeviceCopier
from torchlog.validation import find_replay_problems

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU: torch.cuda.is_available() is False here")
CPU0 = torch.device("cpu", 0)  # != torch.device("cpu"): sends CPU values through the copier


def _values(history: torchlog.ModelHistory) -> dict[str, torch.Tensor]:
    return {p.label: p.tensor_contents for p in history if p.tensor_contents is not None}


def _assert_same_values(a: torchlog.ModelHistory, b: torchlog.ModelHistory) -> None:
    va, vb = _values(a), _values(b)
    assert va.keys() == vb.keys()
    for label, value in va.items():
        other = vb[label]
        assert value.dtype == other.dtype and value.shape == other.shape, label
        assert torch.equal(value.cpu(), other.cpu()), label


# ----- on the CPU: today's behaviour --------------------------------------------------------
@pytest.mark.parametrize("name", sorted(TINY_MODELS))
@pytest.mark.parametrize("device", ["cpu", "cpu:0"])
def test_output_device_cpu_gives_the_in_memory_values(name: str, device: str) -> None:
    make_model, make_input = TINY_MODELS[name]
    torch.manual_seed(0)
    model, x = make_model(), make_input()
    plain = torchlog.log_forward_pass(model, x, random_seed=3)
    moved = torchlog.log_forward_pass(model, x, random_seed=3, output_device=device)
    check_history(moved)
    _assert_same_values(plain, moved)
    assert all(v.device.type == "cpu" for v in _values(moved).values())


class _KeepsOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.kept: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.kept = self.linear(x)
        return self.kept * 2


def test_output_device_of_the_model_still_saves_copies() -> None:
    model = _KeepsOutput()
    history = torchlog.log_forward_pass(model, torch.randn(2, 3), output_device="cpu")
    saved = history["linear_1_1"].tensor_contents
    assert torch.equal(saved, model.kept)
    assert saved.untyped_storage().data_ptr() != model.kept.untyped_storage().data_ptr()


def test_copier_cpu_path_is_to_with_copy() -> None:
    copier = DeviceCopier(CPU0)
    src = torch.randn(3, 4).t()  # strided, not contiguous
    out = copier.copy(src)
    expected = src.to(CPU0, copy=True)
    assert torch.equal(out, src) and out.stride() == expected.stride()
    assert out.untyped_storage().data_ptr() != src.untyped_storage().data_ptr()
    assert copier.num_copies == 1
    copier.wait(0)
    copier.wait(-1)
    copier.wait_for(out)
    copier.wait_for(src)  # not a copy it made: returns at once
    copier.before_write()
    copier.wait_all()
    with pytest.raises(IndexError):
        copier.wait(1)


def test_copier_cpu_path_keeps_autograd_like_to() -> None:
    src = torch.randn(2, requires_grad=True) * 1
    out = DeviceCopier(CPU0).copy(src)
    assert out.requires_grad and type(out.grad_fn) is type(src.to(CPU0, copy=True).grad_fn)


# ----- the CUDA path's ordering, with fake streams and events ------------------------------------
class _FakeEvent:
    def __init__(self, log: list, name: str) -> None:
        self.log, self.name = log, name

    def record(self, stream: _FakeStream) -> None:
        self.log.append(f"{self.name}.record({stream.name})")

    def synchronize(self) -> None:
        self.log.append(f"{self.name}.synchronize")


class _FakeStream:
    def __init__(self, log: list, name: str) -> None:
        self.log, self.name = log, name

    def wait_event(self, event: _FakeEvent) -> None:
        self.log.append(f"{self.name}.wait_event({event.name})")


class FakeStreams:
    """CudaStreams' interface on the CPU: every copy takes the side-stream route; calls are logged."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.current = _FakeStream(self.log, "current")
        self.num_streams = self.num_events = 0

    def is_async(self, src: torch.Tensor, device: torch.device) -> bool:
        return True

    def current_stream(self, device: torch.device) -> _FakeStream:
        return self.current

    def new_stream(self, device: torch.device) -> _FakeStream:
        self.num_streams += 1
        self.log.append(f"new_stream side{self.num_streams}")
        return _FakeStream(self.log, f"side{self.num_streams}")

    def new_event(self) -> _FakeEvent:
        self.num_events += 1
        return _FakeEvent(self.log, f"e{self.num_events}")

    @contextlib.contextmanager
    def use(self, stream: _FakeStream) -> Iterator[None]:
        self.log.append(f"use({stream.name})")
        try:
            yield
        finally:
            self.log.append(f"end use({stream.name})")

    def keep_alive(self, src: torch.Tensor, stream: _FakeStream) -> None:
        self.log.append(f"keep_alive({stream.name})")


class _LogCopies(TorchFunctionMode):
    """Logs every Tensor.to call (the copy itself) into the same list as the fakes."""

    def __init__(self, log: list) -> None:
        super().__init__()
        self.log = log

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") == "to":
            self.log.append(f"copy non_blocking={(kwargs or {}).get('non_blocking')}")
        return func(*args, **(kwargs or {}))


def test_side_stream_copy_is_ordered_after_the_op_and_waited_for_before_reading() -> None:
    streams = FakeStreams()
    copier = DeviceCopier(CPU0, streams)
    a, b = torch.randn(3), torch.randn(4)
    with _LogCopies(streams.log):
        out_a = copier.copy(a)
        out_b = copier.copy(b)
    assert streams.log == [
        "new_stream side1",  # once per pass
        "e1.record(current)", "side1.wait_event(e1)",  # the copy waits for the op
        "use(side1)", "copy non_blocking=True", "end use(side1)",  # enqueued on the side stream
        "keep_alive(side1)", "e2.record(side1)",  # memory kept; completion event
        "e3.record(current)", "side1.wait_event(e3)",
        "use(side1)", "copy non_blocking=True", "end use(side1)",
        "keep_alive(side1)", "e4.record(side1)",
    ]
    assert torch.equal(out_a, a) and torch.equal(out_b, b) and copier.num_copies == 2
    del streams.log[:]
    copier.wait(0)
    copier.wait_for(out_b)
    copier.wait_for(torch.ones(1))  # not its copy: nothing to wait for
    assert streams.log == ["e2.synchronize", "e4.synchronize"]
    del streams.log[:]
    copier.wait_all()
    copier.wait_all()
    copier.wait(1)  # landed already
    assert streams.log == ["e4.synchronize"]  # the last event of the stream covers the others


def test_writes_wait_for_copies_on_the_gpu_not_the_host() -> None:
    streams = FakeStreams()
    copier = DeviceCopier(CPU0, streams)
    copier.before_write()
    assert streams.log == []  # no copy in flight: nothing to order
    copier.copy(torch.randn(2))
    copier.copy(torch.randn(2))
    del streams.log[:]
    copier.before_write()
    copier.before_write()  # nothing new since the first
    assert streams.log == ["current.wait_event(e4)"]
    del streams.log[:]
    copier.copy(torch.randn(2), write_follows=True)  # a buffer the next op may update
    assert streams.log[-1] == "current.wait_event(e6)"
    del streams.log[:]
    copier.before_write()
    assert streams.log == []
    assert not any("synchronize" in line for line in streams.log)


class _InPlaceAfterSave(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(x)
        y.mul_(2)
        return F.relu(y)


def test_recorder_orders_writes_and_waits_at_the_end(monkeypatch) -> None:
    made: list[FakeStreams] = []

    def fake_copier(device: torch.device) -> DeviceCopier:
        made.append(FakeStreams())
        return DeviceCopier(device, made[-1])

    monkeypatch.setattr(recorder_module, "DeviceCopier", fake_copier)
    model, x = _InPlaceAfterSave().train(), torch.randn(3, 4)
    plain = torchlog.log_forward_pass(model, x, random_seed=0)
    model.bn.reset_running_stats()
    history = torchlog.log_forward_pass(model, x, random_seed=0, output_device=CPU0)
    _assert_same_values(plain, history)
    log = made[-1].log
    assert sum(line.startswith("new_stream") for line in log) == 1
    assert _steps(log) == [
        "copy",  # input_1_0
        "copy", "fence",  # buffer num_batches_tracked, which add_ then updates
        "copy", "fence",  # add_1_2: its output is that buffer
        "copy", "fence", "copy", "fence",  # running_mean and running_var, before batch norm
        "copy",  # batchnorm_1_5
        "fence",  # mul_ announces a write into y: the copies reading it first
        "copy", "copy",  # mul_1_6 and relu_1_7 (the output shares relu's copy)
        "sync",  # once, at the end of the pass, before the history exists
    ]


def _steps(log: list[str]) -> list[str]:
    """The fake log as copies, GPU-side waits of the current stream, and host waits; each
    wait is checked to name the latest copy's event."""
    steps, last = [], None
    for line in log:
        if line.endswith(".record(side1)"):
            steps.append("copy")
            last = line.split(".")[0]
        elif line.startswith("current.wait_event"):
            assert line == f"current.wait_event({last})"
            steps.append("fence")
        elif line.endswith(".synchronize"):
            assert line == f"{last}.synchronize"
            steps.append("sync")
    return steps


# ----- on a GPU ------------------------------------------------------------------------------
class _SmallResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True))
        self.block = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                   nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16))
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = F.relu(x + self.block(x))
        return self.head(x.mean((2, 3)))


def _small_transformer() -> nn.Module:
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


_GPU_CASES = {
    "resnet": (_SmallResNet, lambda: torch.randn(2, 3, 32, 32)),
    "transformer": (_small_transformer, lambda: torch.randn(2, 16, 32)),
}


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", sorted(_GPU_CASES))
def test_cuda_values_land_on_pinned_cpu_memory_bit_for_bit(name: str, training: bool) -> None:
    make_model, make_input = _GPU_CASES[name]
    torch.manual_seed(0)
    model, x = make_model().cuda().train(training), make_input().cuda()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    on_gpu = torchlog.log_forward_pass(model, x, random_seed=0)
    model.load_state_dict(state)  # running stats as before the first pass
    on_cpu = torchlog.log_forward_pass(model, x, random_seed=0, output_device="cpu")
    check_history(on_cpu)
    _assert_same_values(on_gpu, on_cpu)
    values = _values(on_cpu)
    assert all(v.device.type == "cpu" and v.is_pinned() for v in values.values())


class _Counter:
    """Counts the calls of a function, or of a method when set on a class (it binds like one)."""

    def __init__(self, func) -> None:
        self.func, self.calls = func, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.func(*args, **kwargs)

    def __get__(self, instance, owner=None):
        return self if instance is None else functools.partial(self, instance)


@pytest.mark.cuda
@needs_cuda
def test_cuda_forward_is_not_synchronized_per_op(monkeypatch) -> None:
    model, x = _SmallResNet().cuda().eval(), torch.randn(2, 3, 32, 32, device="cuda")
    counters = {}
    for owner, name in [(torch.cuda, "synchronize"), (torch.cuda.Event, "synchronize"),
                        (torch.cuda.Stream, "synchronize")]:
        counters[(owner, name)] = _Counter(getattr(owner, name))
        monkeypatch.setattr(owner, name, counters[(owner, name)])
    history = torchlog.log_forward_pass(model, x, output_device="cpu")
    assert len(history) > 20
    assert counters[(torch.cuda, "synchronize")].calls == 0
    assert counters[(torch.cuda.Stream, "synchronize")].calls == 0
    assert counters[(torch.cuda.Event, "synchronize")].calls == 1  # once, at the end of the pass


@pytest.mark.cuda
@needs_cuda
def test_cuda_write_after_save_does_not_reach_the_saved_copy() -> None:
    class BigWrite(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x @ x  # large enough that the copy is still running when mul_ is queued
            y.mul_(0)
            return y + 1

    x = torch.randn(2048, 2048, device="cuda")
    history = torchlog.log_forward_pass(BigWrite(), x, output_device="cpu")
    assert torch.equal(history["matmul_1_1"].tensor_contents, (x @ x).cpu())


@pytest.mark.cuda
@needs_cuda
def test_cuda_to_cpu_then_save_to(tmp_path) -> None:
    model, x = _SmallResNet().cuda().eval(), torch.randn(2, 3, 32, 32, device="cuda")
    plain = torchlog.log_forward_pass(model, x)
    path = str(tmp_path / "run.h5")
    torchlog.log_forward_pass(model, x, output_device="cpu", save_to=path)
    _assert_same_values(plain, torchlog.load(path))


@pytest.mark.cuda
@needs_cuda
def test_cpu_model_saving_to_cuda() -> None:
    model, x = _SmallResNet().eval(), torch.randn(2, 3, 32, 32)
    plain = torchlog.log_forward_pass(model, x)
    moved = torchlog.log_forward_pass(model, x, output_device="cuda")
    assert all(v.is_cuda for v in _values(moved).values())
    _assert_same_values(plain, moved)


class _RandomOnCuda(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.dropout = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        noise = torch.rand(x.shape, device=x.device)
        return self.dropout(self.linear(x + noise))


@pytest.mark.cuda
@needs_cuda
def test_cuda_random_ops_replay_from_their_cuda_rng_state() -> None:
    torch.manual_seed(0)
    model, x = _RandomOnCuda().cuda().train(), torch.randn(4, 8, device="cuda")
    history = torchlog.log_forward_pass(model, x, save_function_args=True, detach_saved_tensors=True)
    assert not find_replay_problems(history).problems
    dropout = next(p for p in history if p.layer_type == "dropout")
    cpu, device, cuda = dropout.rng_state
    assert device == x.get_device() and cuda.dtype == torch.uint8
    other = torch.cuda.get_rng_state(device)
    torch.cuda.manual_seed(12345)
    dropout.rng_state = (cpu, device, torch.cuda.get_rng_state(device))
    torch.cuda.set_rng_state(other, device)
    problems = find_replay_problems(history).problems
    assert [(p.label, p.check) for p in problems] == [(dropout.label, "replay")]
    assert torchlog.validate_saved_activations(model, x, random_seed=1)
