"""Saving without copying: saved activations are the ops' own tensors, copied just before a
write into them, and a write nothing announced makes the pass run again with copies.

Each in-place route writes into a tensor whose value was saved earlier in the pass; the
saved value must be the one from before the write, and the saved value of the write
itself the one after it. Oracle: the same values computed by plain PyTorch outside logging.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlog
from tests.invariants import check_history


class Route(nn.Module):
    """y = x * 2, saved; `write(y)` changes y in place; the model returns y + 1."""

    def __init__(self, write) -> None:
        super().__init__()
        self.write = write

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        self.write(y)
        return y + 1


def _setitem_on_view(y: torch.Tensor) -> None:
    column = y[:, 1]  # a view sharing y's memory
    column[0] = 100.0


def _out_argument(y: torch.Tensor) -> None:
    torch.add(y, 5, out=y)


def _through_data(y: torch.Tensor) -> None:
    y.data.mul_(-1)


def _through_data_setitem(y: torch.Tensor) -> None:
    y.data[0] = 7.0


ROUTES = {
    "method": lambda y: y.add_(3),
    "dunder": lambda y: y.__imul__(4),
    "out": _out_argument,
    "inplace_true": lambda y: torch.nn.functional.relu(y, inplace=True),
    "inplace_true_positional": lambda y: torch.nn.functional.relu(y, True),
    "setitem": lambda y: y.__setitem__(0, 9.0),
    "setitem_on_view": _setitem_on_view,
    "through_data": _through_data,
    "through_data_setitem": _through_data_setitem,
    "init_keyword": lambda y: nn.init.constant_(tensor=y, val=0.5),
}


@pytest.mark.parametrize("route", list(ROUTES))
def test_a_saved_value_is_the_one_before_an_in_place_write(route: str) -> None:
    write = ROUTES[route]
    x = torch.randn(3, 4)
    expected_before = x * 2
    after = x * 2
    write(after)
    assert not torch.equal(after, expected_before), "the route must change the tensor"
    history = torchlog.log_forward_pass(Route(write), x, random_seed=0)
    check_history(history)
    mul = history["mul_1_1"]
    assert torch.equal(mul.tensor_contents, expected_before)
    assert torch.equal(history[-1].tensor_contents, after + 1)
    assert torch.equal(history[-2].tensor_contents, after + 1)


def test_saved_values_are_the_ops_own_tensors_when_nothing_writes() -> None:
    """No copies: the saved value of each op is the very tensor the model computed."""
    kept = {}

    class Keep(nn.Module):
        def forward(self, x):
            kept["a"] = a = torch.tanh(x)
            kept["b"] = b = a * 3
            return b.sum()

    history = torchlog.log_forward_pass(Keep(), torch.randn(5), random_seed=0)
    assert history["tanh_1_1"].tensor_contents is kept["a"]
    assert history["mul_1_2"].tensor_contents is kept["b"]


def test_the_input_is_copied() -> None:
    """Inputs and buffers are copies: the caller may change them after logging."""
    x = torch.randn(4)
    before = x.clone()
    history = torchlog.log_forward_pass(nn.ReLU(), x, random_seed=0)
    x.add_(1)
    assert torch.equal(history[0].tensor_contents, before)


def test_a_write_nothing_announced_runs_the_pass_again_with_copies() -> None:
    """A write the capture mode cannot see (torch functions disabled inside forward) bumps
    the version counter: the pass runs again copying that op, and the value is right."""
    runs = []

    class Hidden(nn.Module):
        def forward(self, x):
            runs.append(1)
            y = torch.sin(x)
            with torch._C.DisableTorchFunction():
                y.add_(10)  # unseen by the mode: no copy is made before it
            return y * 2

    x = torch.randn(6)
    history = torchlog.log_forward_pass(Hidden(), x, random_seed=0)
    assert len(runs) == 2, "the pass must run again once"
    assert torch.equal(history["sin_1_1"].tensor_contents, torch.sin(x))
    assert torch.equal(history[-2].tensor_contents, (torch.sin(x) + 10) * 2)
    check_history(history)


def test_saving_a_selection_copies_views() -> None:
    """A view saved alone would keep its whole base alive: it is copied."""

    class Views(nn.Module):
        def forward(self, x):
            big = x * 2
            return big[:, 0].sum()

    x = torch.randn(1000, 10)
    history = torchlog.log_forward_pass(Views(), x, layers_to_save=["getitem_1_2"], random_seed=0)
    saved = history["getitem_1_2"].tensor_contents
    assert saved._base is None and saved.untyped_storage().nbytes() == saved.nbytes
    assert torch.equal(saved, (x * 2)[:, 0])


def test_inference_tensors_are_copied() -> None:
    """Inference-mode tensors have no version counter to check: they are copied."""
    with torch.inference_mode():
        x = torch.randn(3)
        history = torchlog.log_forward_pass(nn.Sequential(nn.Tanh(), nn.ReLU()), x, random_seed=0)
    assert torch.equal(history["tanh_1_1"].tensor_contents, torch.tanh(x))


def test_a_triton_kernel_writing_into_a_saved_tensor() -> None:
    pytest.importorskip("triton")
    from tests import triton_models as tm

    class Zeroed(nn.Module):
        def forward(self, x):
            y = x * 2
            tm.zero_kernel[(4,)](y, y.numel(), BLOCK=8)
            return y + 1

    x = torch.randn(32, device=tm.DEVICE)
    history = torchlog.log_forward_pass(Zeroed(), x, random_seed=0)
    assert torch.equal(history["mul_1_1"].tensor_contents, x * 2)
    assert torch.equal(history[-1].tensor_contents, torch.ones_like(x))


def test_a_value_sharing_a_buffers_memory_is_copied() -> None:
    """A view of a buffer, or a write through `buf.data`, shares the buffer's memory, which
    is put back in place after the pass: the saved value is a copy, as it was then."""

    class Stats(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("buf", torch.zeros(4))

        def forward(self, x):
            self.buf.add_(x)
            view = self.buf[1:]
            self.buf.data.copy_(x * 3)
            return view * 1

    x = torch.arange(4.0) + 1
    history = torchlog.log_forward_pass(Stats(), x, random_seed=0)
    assert torch.equal(history["getitem_1_3"].tensor_contents, x[1:])
    assert torch.equal(history[-1].tensor_contents, (x * 3)[1:])
    copied = [p for p in history if p.func_name == "copy_"]
    assert copied and torch.equal(copied[0].tensor_contents, x * 3)
