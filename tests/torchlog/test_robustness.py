"""Logging leaves torch and the model as they were: after errors, interrupts, many calls,
other threads, nested calls, grad modes, dtypes, output structures and torch.compile."""
from __future__ import annotations

import dataclasses
import gc
import statistics
import threading
import time
import warnings

import pytest
import torch
from torch import nn

import torchlog
from tests.invariants import check_history
from tests.models import TINY_MODELS, Nested, SimpleRecurrent
from tests.state_snapshot import differences, model_state, take
from torchlog.errors import CompiledModelWarning, NestedLoggingError, TorchlogWarning


def _same_history(got: torchlog.ModelHistory, want: torchlog.ModelHistory) -> None:
    """Same ops, links, modules and saved values, pass by pass."""
    assert got.layer_labels == want.layer_labels
    for a, b in zip(got, want):
        assert (a.func_name, a.tensor_meta, a.parents, a.children, a.containing_modules,
                a.output_of_modules) == (b.func_name, b.tensor_meta, b.parents, b.children,
                                         b.containing_modules, b.output_of_modules), a.label
        assert torch.equal(a.tensor_contents, b.tensor_contents), a.label


# ----- a normal call ------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_state_unchanged_after_a_normal_call(name):
    make_model, make_input = TINY_MODELS[name]
    torch.manual_seed(0)
    model, x = make_model(), make_input()
    before = take(model)
    history = torchlog.log_forward_pass(model, x)
    assert differences(before, take(model)) == []
    check_history(history)


def test_state_unchanged_with_layers_to_save_list_and_stateful_model():
    """Two passes run (choose, then save); buffers forward updates are put back after each."""
    make_model, make_input = TINY_MODELS["train_eval"]
    torch.manual_seed(0)
    model, x = make_model(), make_input()
    before = take(model)
    history = torchlog.log_forward_pass(model, x, layers_to_save=["bn", -1], random_seed=5)
    assert differences(before, take(model)) == []
    full = torchlog.log_forward_pass(model, x, random_seed=5)
    assert torch.equal(history[-1].tensor_contents, full[-1].tensor_contents)


def test_buffer_reassigned_in_forward_is_put_back_and_both_passes_agree():
    make_model, make_input = TINY_MODELS["buffers"]  # forward does self.calls = self.calls + 1
    torch.manual_seed(0)
    model, x = make_model(), make_input()
    calls = model.calls
    selected = torchlog.log_forward_pass(model, x, layers_to_save=[-1], random_seed=1)
    full = torchlog.log_forward_pass(model, x, random_seed=1)
    assert model.calls is calls and float(calls) == 0.0
    assert torch.equal(selected[-1].tensor_contents, full[-1].tensor_contents)
    assert torch.equal(full[-1].tensor_contents, model(x))


# ----- a model that raises or is interrupted ----------------------------------------------------
class Raises(nn.Module):
    """Raises `error` from a nested module after some ops, or from forward itself."""

    class Inner(nn.Module):
        def __init__(self, error: BaseException | None) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.error = error

        def forward(self, x):
            x = self.lin(x).relu()
            if self.error is not None:
                raise self.error
            return x

    def __init__(self, error: BaseException, where: str) -> None:
        super().__init__()
        self.inner = Raises.Inner(error if where == "nested" else None)
        self.norm = nn.BatchNorm1d(4)
        self.error = error if where == "forward" else None

    def forward(self, x):
        x = self.inner(self.norm(x))
        if self.error is not None:
            raise self.error
        return x * 2


_FAILURES = {
    "shape": lambda: RuntimeError("shape mismatch"),
    "assert": lambda: AssertionError("bad"),
    "key": lambda: KeyError("missing"),
    "interrupt": KeyboardInterrupt,
}


@pytest.mark.parametrize("where", ["forward", "nested"])
@pytest.mark.parametrize("kind", sorted(_FAILURES))
@pytest.mark.parametrize("on_error", ["raise", "return"])
def test_state_unchanged_after_a_failure(kind, where, on_error):
    torch.manual_seed(0)
    error = _FAILURES[kind]()
    model, x = Raises(error, where), torch.rand(3, 4)  # train mode: BatchNorm updates its stats
    before = take(model)
    if isinstance(error, Exception) and on_error == "return":
        assert torchlog.log_forward_pass(model, x, on_error=on_error).is_partial
    else:
        with pytest.raises(type(error)):
            torchlog.log_forward_pass(model, x, on_error=on_error)
    assert differences(before, take(model)) == []


def test_interrupted_model_logs_normally_afterwards():
    torch.manual_seed(0)
    model = Raises(KeyboardInterrupt(), "nested")
    with pytest.raises(KeyboardInterrupt):
        torchlog.log_forward_pass(model, torch.rand(3, 4))
    model.inner.error = None
    history = torchlog.log_forward_pass(model, torch.rand(3, 4))
    check_history(history)
    assert [m for m in history.modules] == ["inner", "inner.lin", "norm"]
    assert history["inner"].containing_modules == ("inner:1",)


# ----- many calls ----------------------------------------------------------------------------
def _rss() -> int:
    import psutil  # in the dev extra

    gc.collect()
    return psutil.Process().memory_info().rss


def test_hundred_calls_leave_no_hooks_modes_or_memory_behind():
    torch.manual_seed(0)
    model, x = SimpleRecurrent(), torch.rand(6, 5)
    before = take(model)
    for _ in range(10):
        torchlog.log_forward_pass(model, x)
    after_ten = _rss()
    for _ in range(90):
        torchlog.log_forward_pass(model, x)
    after_hundred = _rss()
    assert differences(before, take(model)) == []
    assert after_hundred <= after_ten * 1.05, (after_ten, after_hundred)


# ----- threads ---------------------------------------------------------------------------------
class _OtherThread:
    """Runs batches of an op the logged models never use, timing each batch, until stopped."""

    def __init__(self) -> None:
        self.timings: list[float] = []
        self.mode_depths: set[int] = set()  # TorchFunctionModes active in this thread
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.a, self.b = torch.rand(8), torch.rand(8) + 1

    def _run(self) -> None:
        while not self.stop.is_set():
            # This thread's CPU time: waiting for the GIL while the other thread runs Python
            # is not a slowdown of these ops, and made wall-clock timings flaky on 2 cores.
            self.mode_depths.add(torch._C._len_torch_function_stack())
            start = time.thread_time()
            for _ in range(50):
                torch.atan2(self.a, self.b)
            self.timings.append(time.thread_time() - start)
            time.sleep(0.001)  # leave the GIL to the logging thread most of the time

    def during(self, work) -> list:
        self.thread.start()
        try:
            results = [work() for _ in range(10)]
            while len(self.timings) < 5:  # enough batches on the other side to compare
                results.append(work())
            return results
        finally:
            self.stop.set()
            self.thread.join()


def test_ops_in_other_threads_are_not_recorded_nor_slowed():
    torch.manual_seed(0)
    model, x = Nested(), torch.rand(2, 4)
    reference = torchlog.log_forward_pass(model, x, random_seed=1)
    plain = _OtherThread()
    plain.during(lambda: [model(x) for _ in range(10)])
    logged = _OtherThread()
    histories = logged.during(lambda: torchlog.log_forward_pass(model, x, random_seed=1))
    for history in histories:
        assert "atan2" not in {p.func_name for p in history}
        _same_history(history, reference)
    assert len(plain.timings) >= 5 and len(logged.timings) >= 5
    # The other thread's ops never pass through torchlog: no mode is active there.
    assert logged.mode_depths == {0}
    # Generous: the threads still share the GIL and 2 cores; a leaked mode would cost far more.
    assert statistics.median(logged.timings) < 10 * statistics.median(plain.timings)


class _Meets(nn.Module):
    """Wraps a model; forward waits at a barrier so that two threads log at the same time."""

    def __init__(self, model: nn.Module, barrier: threading.Barrier | None) -> None:
        super().__init__()
        self.model = model
        self.barrier = barrier

    def forward(self, x):
        y = self.model(x)
        if self.barrier is not None:
            self.barrier.wait()
        return y * 2


def _log_in_threads(jobs: list[tuple[nn.Module, torch.Tensor, int]]) -> list:
    results: list = [None] * len(jobs)

    def work(i: int) -> None:
        model, x, seed = jobs[i]
        try:
            results[i] = torchlog.log_forward_pass(model, x, random_seed=seed)
        except BaseException as exc:  # reported by the main thread
            results[i] = exc

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


def test_two_threads_log_their_own_models_at_once():
    torch.manual_seed(0)
    barrier = threading.Barrier(2, timeout=30)
    first, second = _Meets(Nested(), barrier), _Meets(SimpleRecurrent(), barrier)
    x1, x2 = torch.rand(2, 4), torch.rand(6, 5)
    results = _log_in_threads([(first, x1, 11), (second, x2, 22)])
    first.barrier = second.barrier = None
    for result, (model, x, seed) in zip(results, [(first, x1, 11), (second, x2, 22)]):
        assert isinstance(result, torchlog.ModelHistory), result
        _same_history(result, torchlog.log_forward_pass(model, x, random_seed=seed))
        check_history(result)


def test_two_threads_log_one_shared_model_at_once():
    torch.manual_seed(0)
    barrier = threading.Barrier(2, timeout=30)
    model, x = _Meets(Nested(), barrier), torch.rand(2, 4)
    before = model_state(model)  # global RNG: see test_rng_state_restored_after_two_threads...
    results = _log_in_threads([(model, x, 1), (model, x * 2, 2)])
    model.barrier = None
    assert differences(before, model_state(model)) == []
    for result, (xi, seed) in zip(results, [(x, 1), (x * 2, 2)]):
        assert isinstance(result, torchlog.ModelHistory), result
        _same_history(result, torchlog.log_forward_pass(model, xi, random_seed=seed))


def test_rng_state_restored_after_two_threads_log_at_once():
    """Thread A starts and ends while B is inside its pass (forced with events)."""

    class Step(nn.Module):
        def __init__(self, wait: threading.Event, then: threading.Event) -> None:
            super().__init__()
            self.wait, self.then = wait, then

        def forward(self, x):
            self.then.set()
            assert self.wait.wait(timeout=30)
            return x + 1

    a_inside, b_inside, a_done = threading.Event(), threading.Event(), threading.Event()
    model_a = Step(b_inside, a_inside)  # A waits until B is inside its forward
    model_b = Step(a_done, b_inside)  # B waits until A has finished logging
    torch.manual_seed(123)
    before = take()

    def log_a() -> None:
        torchlog.log_forward_pass(model_a, torch.zeros(2), random_seed=1)
        a_done.set()

    thread_a = threading.Thread(target=log_a)
    thread_a.start()
    assert a_inside.wait(timeout=30)
    thread_b = threading.Thread(target=torchlog.log_forward_pass, args=(model_b, torch.zeros(2)),
                                kwargs={"random_seed": 2})
    thread_b.start()
    thread_a.join(timeout=30)
    thread_b.join(timeout=30)
    assert differences(before, take()) == []


# ----- nested log_forward_pass -----------------------------------------------------------------
class LogsSubmodel(nn.Module):
    """Forward logs its own submodule; with `catch`, it goes on after NestedLoggingError."""

    def __init__(self, attempt: bool, catch: bool) -> None:
        super().__init__()
        self.sub = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))  # buffers: no trace of them
        self.attempt, self.catch = attempt, catch

    def forward(self, x):
        y = torch.sigmoid(x)
        if self.attempt:
            try:
                torchlog.log_forward_pass(self.sub, y)
            except NestedLoggingError:
                if not self.catch:
                    raise
        return self.sub(y) + y


def test_nested_log_raises_a_clear_error_and_keeps_the_outer_partial_history():
    torch.manual_seed(0)
    model, x = LogsSubmodel(attempt=True, catch=False), torch.rand(2, 4)
    before = take(model)
    with pytest.raises(NestedLoggingError, match="inside another log_forward_pass") as info:
        torchlog.log_forward_pass(model, x)
    assert differences(before, take(model)) == []
    partial = info.value.torchlog_history
    check_history(partial)
    assert partial.layer_labels == ["input_1_0", "sigmoid_1_1"]
    assert "NestedLoggingError" in info.value.__notes__[0]
    sub = torchlog.log_forward_pass(model.sub, x)  # the thread is not left marked as logging
    assert {"linear", "batchnorm"} <= {p.layer_type for p in sub} and sub[-1].is_output


def test_nested_log_that_is_caught_does_not_change_the_outer_history():
    torch.manual_seed(0)
    model, x = LogsSubmodel(attempt=True, catch=True), torch.rand(2, 4)
    clean = LogsSubmodel(attempt=False, catch=False)
    clean.load_state_dict(model.state_dict())
    _same_history(torchlog.log_forward_pass(model, x, random_seed=4),
                  torchlog.log_forward_pass(clean, x, random_seed=4))


# ----- grad modes, dtypes, output structures -------------------------------------------------------
_CONTEXTS = {
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
    "autocast_bf16": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
}


@pytest.mark.parametrize("context", sorted(_CONTEXTS))
def test_works_under_grad_and_autocast_contexts(context):
    torch.manual_seed(0)
    model, x = Nested(), torch.rand(2, 4)
    with _CONTEXTS[context]():
        before = take(model)
        history = torchlog.log_forward_pass(model, x)
        assert differences(before, take(model)) == []
        expected = model(x)
    check_history(history)
    out = history[history.output_layers[0]].tensor_contents
    assert out.dtype == expected.dtype and torch.equal(out, expected)
    if context == "autocast_bf16":
        assert history["head"].dtype == torch.bfloat16
        assert history["head"].grad_fn_name is not None
    else:
        assert all(p.grad_fn_name is None for p in history)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.complex64])
def test_works_with_dtypes(dtype):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3, dtype=dtype), nn.Tanh())
    x = torch.randn(2, 4, dtype=dtype)
    history = torchlog.log_forward_pass(model, x)
    check_history(history)
    assert [p.dtype for p in history] == [dtype] * 4
    assert torch.equal(history["1"].tensor_contents, model(x))


@dataclasses.dataclass
class Pair:
    first: torch.Tensor
    second: torch.Tensor


class Structured(nn.Module):
    """Returns its two results as a tensor, tuple, list, dict, dataclass or nothing."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        a, b = self.lin(x), x.cos()
        return {"tensor": a, "tuple": (a, b), "list": [a, b], "dict": {"a": a, "b": b},
                "dataclass": Pair(a, b), "none": None}[self.kind]


@pytest.mark.parametrize("kind, expected", [
    ("tensor", lambda a, b: [a]), ("tuple", lambda a, b: [a, b]), ("list", lambda a, b: [a, b]),
    ("dict", lambda a, b: [a, b]), ("dataclass", lambda a, b: [a, b]), ("none", lambda a, b: []),
])
def test_works_with_output_structures(kind, expected):
    torch.manual_seed(0)
    model, x = Structured(kind), torch.rand(2, 4)
    history = torchlog.log_forward_pass(model, x)
    check_history(history)
    outputs = [history[label].tensor_contents for label in history.output_layers]
    want = expected(model.lin(x), x.cos())
    assert len(outputs) == len(want)
    assert all(torch.equal(got, w) for got, w in zip(outputs, want))


# ----- torch.compile -------------------------------------------------------------------------------
def test_compiled_model_is_logged_eagerly_with_a_warning():
    assert issubclass(CompiledModelWarning, TorchlogWarning) and issubclass(TorchlogWarning, UserWarning)
    torch.manual_seed(0)
    eager, x = Nested(), torch.rand(2, 4)
    compiled = torch.compile(eager)
    before = take(compiled)
    with pytest.warns(CompiledModelWarning, match="_orig_mod") as caught:
        history = torchlog.log_forward_pass(compiled, x, random_seed=2)
    assert caught[0].filename == __file__  # stacklevel points at the caller
    assert differences(before, take(compiled)) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the eager model itself logs without warnings
        reference = torchlog.log_forward_pass(eager, x, random_seed=2)
    _same_history(history, reference)


def test_compiled_submodule_runs_eagerly_while_logging():
    torch.manual_seed(0)

    class Holder(nn.Module):
        def __init__(self, block: nn.Module) -> None:
            super().__init__()
            self.block = block

        def forward(self, x):
            return self.block(x) * 2

    block, x = Nested(), torch.rand(2, 4)
    model = Holder(torch.compile(block))
    from torch._dynamo.utils import counters  # imported by torch.compile above

    before = take(model)
    frames = dict(counters["frames"])
    with pytest.warns(CompiledModelWarning, match="'block'"):
        history = torchlog.log_forward_pass(model, x)
    assert dict(counters["frames"]) == frames  # dynamo compiled nothing
    assert differences(before, take(model)) == []
    reference = torchlog.log_forward_pass(Holder(block), x)
    assert [p.func_name for p in history] == [p.func_name for p in reference]
    assert all(torch.equal(a.tensor_contents, b.tensor_contents) for a, b in zip(history, reference))


def test_numpy_draws_follow_the_seed_only_when_one_is_given() -> None:
    """With random_seed, numpy's global RNG is seeded for the pass and restored after; without
    one it is left alone (saving its state costs more than logging a small model): forward
    draws from the caller's stream, which moves on as it would without logging."""
    import numpy as np

    class Draws(nn.Module):
        def forward(self, x):
            return x + float(np.random.rand())

    x = torch.zeros(1)
    np.random.seed(123)
    expected_unseeded = np.random.rand()
    after_one_draw = np.random.get_state()[1].copy()
    np.random.seed(123)
    unseeded = torchlog.log_forward_pass(Draws(), x)
    assert unseeded[-1].tensor_contents.item() == pytest.approx(expected_unseeded)
    assert np.array_equal(np.random.get_state()[1], after_one_draw)

    np.random.seed(5)
    before = np.random.get_state()[1].copy()
    first = torchlog.log_forward_pass(Draws(), x, random_seed=7)[-1].tensor_contents
    second = torchlog.log_forward_pass(Draws(), x, random_seed=7)[-1].tensor_contents
    assert torch.equal(first, second)
    assert np.array_equal(np.random.get_state()[1], before)
