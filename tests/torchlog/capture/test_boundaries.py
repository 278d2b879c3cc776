"""Module boundaries through wrapped forwards (torchlog/capture/boundaries.py): what the
module stack sees, and that every wrapper is gone afterwards, whatever happened."""
from __future__ import annotations

import inspect
import threading

import pytest
import torch
from torch import nn

import torchlog
from tests.state_snapshot import differences, take
from torchlog.capture import boundaries


class Double(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = Double(), nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x)) + 1


def _calls(history: torchlog.ModelHistory) -> dict[str, int]:
    return {address: record.num_passes for address, record in history.modules.items()}


def test_no_wrapper_is_left_and_the_model_is_unchanged():
    model, x = Pair(), torch.randn(2, 3)
    before = take(model)
    history = torchlog.log_forward_pass(model, x)
    assert _calls(history) == {"a": 1, "b": 1}
    assert differences(before, take(model)) == []
    assert all("forward" not in vars(m) for m in model.modules())
    assert boundaries._installed == {}


def test_an_instance_forward_set_by_the_user_is_wrapped_and_put_back():
    model = Pair()
    calls = []

    def traced(x):  # a forward the user set on the instance, as accelerate's hooks do
        calls.append(1)
        return x * 3

    model.a.forward = traced
    x = torch.randn(2, 3)
    before = take(model)
    history = torchlog.log_forward_pass(model, x)
    assert calls == [1]
    assert vars(model.a)["forward"] is traced
    assert differences(before, take(model)) == []
    assert history["a"].func_name == "mul" and _calls(history) == {"a": 1, "b": 1}


class WithA(nn.Module):
    """A model with one submodule `a`; subclasses say what forward does with it."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Double()


class Raises(WithA):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.a(x)
        raise ValueError("boom")


@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
def test_wrappers_are_removed_when_forward_raises(error):
    class Inner(nn.Module):
        def forward(self, x):
            raise error("inside a")

    model, x = Raises(), torch.randn(2, 3)
    model.a = Inner()
    before = take(model)
    with pytest.raises(error):
        torchlog.log_forward_pass(model, x)
    assert differences(before, take(model)) == []
    assert boundaries._installed == {}


def test_the_module_a_raise_passed_through_is_named():
    model = Raises()
    with pytest.raises(ValueError) as caught:
        torchlog.log_forward_pass(model, torch.randn(2, 3))
    history = caught.value.torchlog_history
    assert history.info.is_partial
    assert _calls(history) == {"a": 1}  # `a` returned before the model raised
    assert "at the model's top level" in history.info.failure


def test_a_forward_replaced_during_the_pass_is_left_as_the_model_set_it():
    class Swaps(WithA):
        def forward(self, x):
            y = self.a(x)
            self.a.forward = lambda v: v - 1  # the model's own change, kept afterwards
            return y

    model = Swaps()
    torchlog.log_forward_pass(model, torch.randn(2, 3))
    assert vars(model.a)["forward"](torch.ones(1)).item() == 0
    assert boundaries._installed == {}


def test_the_signature_of_a_wrapped_forward_reads_as_the_original():
    seen = []

    class Inspects(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.b = nn.Linear(3, 3)

        def forward(self, x):  # as code that checks which keywords a submodule takes
            seen.append(list(inspect.signature(self.b.forward).parameters))
            return self.b(x)

    torchlog.log_forward_pass(Inspects(), torch.randn(2, 3))
    assert seen == [list(inspect.signature(nn.Linear(3, 3).forward).parameters)] == [["input"]]


def test_a_direct_forward_call_counts_as_a_module_call():
    class Direct(WithA):
        def forward(self, x):
            return self.a.forward(x) + self.a(x)

    history = torchlog.log_forward_pass(Direct(), torch.randn(2, 3))
    assert _calls(history) == {"a": 2}
    assert [p.containing_modules for p in history if p.func_name == "mul"] == [("a:1",), ("a:2",)]


def test_ops_of_a_module_pre_hook_run_inside_the_module():
    model = Pair()
    handle = model.b.register_forward_pre_hook(lambda module, args: (args[0] - 5,))
    try:
        history = torchlog.log_forward_pass(model, torch.randn(2, 3))
        assert list(model.b._forward_pre_hooks) == [handle.id] and not model.b._forward_hooks
    finally:
        handle.remove()
    sub = [p for p in history if p.func_name == "sub"]
    assert len(sub) == 1 and sub[0].containing_modules == ("b:1",)
    linear = history["b"]
    assert linear.containing_modules == ("b:1",) and linear.parents[0].label == sub[0].label
    assert "forward" not in vars(model.b)


@pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated:FutureWarning")
def test_weight_norm_computes_its_weight_inside_its_module():
    model = Pair()
    model.b = torch.nn.utils.weight_norm(nn.Linear(3, 3))  # a forward pre-hook sets b.weight
    history = torchlog.log_forward_pass(model, torch.randn(2, 3))
    linear = next(p for p in history if p.func_name == "linear")
    assert linear.containing_modules == ("b:1",)
    weight_ops = [p for p in history if p.func_name == "_weight_norm"]
    assert len(weight_ops) == 1 and weight_ops[0].containing_modules == ("b:1",)
    assert any(edge.label == weight_ops[0].label for edge in linear.parents)


def test_a_hooked_module_that_raises_is_named_and_its_hooks_removed():
    class Fails(nn.Module):
        def forward(self, x):
            raise RuntimeError("in a")

    model = Raises()
    model.a = Fails()
    model.a.register_forward_pre_hook(lambda module, args: None)
    x = torch.randn(2, 3)
    before = take(model)
    with pytest.raises(RuntimeError) as caught:
        torchlog.log_forward_pass(model, x)
    assert "in module 'a' (call 1)" in caught.value.torchlog_history.info.failure
    assert differences(before, take(model)) == []


def test_a_hooked_module_called_while_an_exception_is_handled_returns_normally():
    class Handles(WithA):
        def forward(self, x):
            try:
                raise KeyError("handled by the model")
            except KeyError:
                return self.a(x) + 1  # sys.exc_info() is set while `a` runs and returns

    model = Handles()
    model.a.register_forward_pre_hook(lambda module, args: None)
    history = torchlog.log_forward_pass(model, torch.randn(2, 3))
    mul = next(p for p in history if p.func_name == "mul")
    assert mul.output_of_modules == ("a:1",) and not history.info.is_partial


def test_a_module_with_hooks_of_its_own_still_opens_and_closes():
    model = Pair()
    handles = [model.a.register_forward_hook(lambda m, a, out: out + 1),
               model.b.register_forward_pre_hook(lambda m, a: None)]
    try:
        history = torchlog.log_forward_pass(model, torch.randn(2, 3))
    finally:
        for handle in handles:
            handle.remove()
    assert _calls(history) == {"a": 1, "b": 1}
    mul = next(p for p in history if p.func_name == "mul")
    assert mul.output_of_modules == ("a:1",)  # what forward returned, before the user's hook
    add = [p for p in history if p.func_name == "add"]
    assert add[0].containing_modules == () and add[0].parents[0].label == mul.label


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_a_torchscript_submodule_is_a_module_call_and_is_put_back():
    model = Pair()
    model.a = torch.jit.script(Double())
    own = vars(model.a).get("forward")
    x = torch.randn(2, 3)
    before = take(model)
    history = torchlog.log_forward_pass(model, x)
    assert _calls(history) == {"a": 1, "b": 1}
    assert vars(model.a).get("forward") is own
    assert differences(before, take(model)) == []


class Gated(nn.Module):
    """Pair's ops with a module `gate` called first, to hold a pass inside forward."""

    def __init__(self, gate: nn.Module) -> None:
        super().__init__()
        self.gate, self.a, self.b = gate, Double(), nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(self.gate(x))) + 1


def test_two_threads_logging_one_model_at_once():
    """Overlapping passes share the wrappers: each records its own thread's calls, and the
    last one out removes them."""
    inside = threading.Barrier(2, timeout=30)

    class Meet(nn.Module):  # holds each pass inside forward until both passes are there
        def forward(self, v):
            inside.wait()
            return v

    model, x = Gated(Meet()), torch.randn(2, 3)
    results, errors = [], []

    def log() -> None:
        try:
            for _ in range(3):
                results.append(_calls(torchlog.log_forward_pass(model, x)))
        except BaseException as exc:  # reported below, in the main thread
            errors.append(exc)
            inside.abort()

    threads = [threading.Thread(target=log) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert results == [{"gate": 1, "a": 1, "b": 1}] * 6
    assert boundaries._installed == {}
    assert all("forward" not in vars(m) for m in model.modules())


def test_a_thread_that_does_not_log_passes_straight_through():
    entered, release = threading.Event(), threading.Event()

    class Hold(nn.Module):  # the logging pass waits here while another thread runs the model
        def forward(self, v):
            if threading.current_thread() is threading.main_thread():
                entered.set()
                release.wait(30)
            return v

    model, x = Gated(Hold()), torch.randn(2, 3)
    other = []

    def plain() -> None:
        entered.wait(30)
        try:
            other.append(model(x))  # through the wrappers, in a thread that does not log
        finally:
            release.set()

    worker = threading.Thread(target=plain)
    worker.start()
    try:
        history = torchlog.log_forward_pass(model, x)
    finally:
        worker.join(30)
    assert len(other) == 1
    assert _calls(history) == {"gate": 1, "a": 1, "b": 1}
    assert torch.equal(other[0], history[-1].tensor_contents)


@pytest.mark.parametrize("root", [False, True])
def test_modules_a_multi_device_data_parallel_copies_are_left_unwrapped(root):
    """DataParallel over several GPUs copies its module's `__dict__` into replicas on every
    call: a copied wrapper would run the original module. This machine has no GPU, so the
    replicas are not run: forward reaches the inner module directly and checks that it
    was left alone, while a module outside it was wrapped."""
    seen = []

    class Inner(nn.Module):
        def forward(self, x):
            seen.append("forward" in vars(self))
            return x * 2

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.parallel, self.after = nn.DataParallel(Inner()), Double()

        def forward(self, x):
            seen.append("forward" in vars(self.after))
            return self.after(self.parallel.module(x))

    model = Outer()
    parallel = model.parallel
    if root:  # the DataParallel is what is logged; forward goes straight to its module
        parallel = nn.DataParallel(Inner())
        parallel.forward = lambda x: parallel.module(x)  # set on the instance; put back after
        model = parallel
    parallel.device_ids = [0, 1]  # as DataParallel over two GPUs sets it
    history = torchlog.log_forward_pass(model, torch.randn(2, 3))
    assert seen == ([False] if root else [True, False])
    assert boundaries._installed == {}
    assert [p.func_name for p in history if p.kind == "op"] == ["mul"] * (1 if root else 2)
