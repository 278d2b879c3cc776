"""Random small models, random sites: the recorder, the lean capture and replay give one answer.

Models are drawn from the steps of tests/plan_models.py (an `out=` op, in-place ops,
`t.data = v`, a write through a view, `t[i] = v`, a module returning a tuple, an LSTM, a
loop), and sites from every spelling that names a step's key op, its module's output or its
input, one or two at a time. Each case runs through `log_forward_pass`, `torchlog.run` and
`replay`: their outputs must equal the model's own code making the same edits (taps in its
forward, or forward hooks and pre-hooks), they must report the same firings, and where
replay cannot act (a module's input, a view's value after a write) it must say so.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchlog
from tests.plan_models import STEPS, WIDTH, Composed, Loop, hook, key_passes, make
from torchlog import select
from torchlog.errors import InterventionError
from torchlog.history import ModelHistory
from torchlog.interventions import add, clamp, scale, zero_ablate
from torchlog.replay import replay

VECTOR = torch.linspace(-1.0, 1.0, WIDTH)
ACTIONS = {  # name -> (torchlog's action, the same edit in plain PyTorch)
    "scale": (scale(-3.0), lambda t: t * -3.0),
    "add": (add(VECTOR), lambda t: t + VECTOR),
    "clamp": (clamp(-0.3, 0.3), lambda t: t.clamp(-0.3, 0.3)),
    "zero": (zero_ablate(), torch.zeros_like),
}
OP_SPELLINGS = ("label", "position", "func")
# A module spelling: (address under the step, call, which tensor, on its input).
MODULE_SPELLINGS = {
    "module": ("", None, 0, False),
    "module input": ("", None, 0, True),
    "output 1 of a tuple": (".pair", None, 1, False),
    "h_n of an LSTM": (".lstm", None, 1, False),
    "a module call in a loop": (".fc", 2, 0, False),
    "every call in a loop": (".fc", None, 0, False),
}
EXTRA = {"tuple": ("output 1 of a tuple",), "lstm": ("h_n of an LSTM",),
         "loop": ("a module call in a loop", "every call in a loop")}


def _spellings(kind: str) -> tuple[str, ...]:
    return OP_SPELLINGS + ("module", "module input") + EXTRA.get(kind, ())


@st.composite
def _cases(draw: Any) -> tuple[tuple[str, ...], list[tuple[int, str, int, str]], int]:
    """(step kinds, [(step, spelling, pass number, action name)], seed); sites on distinct steps."""
    kinds = tuple(draw(st.lists(st.sampled_from(sorted(STEPS)), min_size=1, max_size=4)))
    steps = draw(st.lists(st.integers(0, len(kinds) - 1), min_size=1, max_size=2, unique=True))
    sites = []
    for index in steps:
        spelling = draw(st.sampled_from(_spellings(kinds[index])))
        number = draw(st.integers(1, Loop.num_passes)) if kinds[index] == "loop" else 1
        sites.append((index, spelling, number, draw(st.sampled_from(sorted(ACTIONS)))))
    return kinds, sites, draw(st.integers(0, 2 ** 16))


def _site(model: Composed, plain: ModelHistory, index: int, spelling: str, number: int) -> Any:
    """What a user writes for the spelling at step `index`."""
    if spelling in ("label", "position"):
        key = key_passes(plain, model, index)[number - 1]
        return key.label if spelling == "label" else key.op_index
    if spelling == "func":
        return select.func(model.steps[index].key_func) & select.in_module(f"steps.{index}")
    below, call, output, on_input = MODULE_SPELLINGS[spelling]
    address = f"steps.{index}{below}"
    if on_input:
        return select.module_input(address)
    if call is not None:
        return f"{address}:{call}"
    return select.module(address, output=output) if output else address


def _install(model: Composed, index: int, spelling: str, number: int, edit: Any) -> Any:
    """Make the same edit in plain PyTorch; returns a handle whose remove() undoes it."""
    if spelling in OP_SPELLINGS:
        step = model.steps[index]
        step.edits[None if spelling == "func" else number] = edit
        return _Cleared(step)
    below, call, output, on_input = MODULE_SPELLINGS[spelling]
    return hook(model, f"steps.{index}{below}", edit, call, output, on_input)


class _Cleared:
    def __init__(self, step: Any) -> None:
        self.step = step

    def remove(self) -> None:
        self.step.edits = {}


def _oracle(model: Composed, x: torch.Tensor, drawn: list) -> torch.Tensor:
    handles = [_install(model, index, spelling, number, ACTIONS[name][1]) for index, spelling, number, name in drawn]
    model.reset_taps()
    try:
        with torch.no_grad():
            return model(x.clone())
    finally:
        for handle in handles:
            handle.remove()
        model.reset_taps()


def _firings(records: Any) -> list[tuple[int, float]]:
    return sorted((record.number, record.max_abs_change) for record in records)


def _same_firings(first: Any, second: Any) -> None:
    a, b = _firings(first), _firings(second)
    assert [n for n, _ in a] == [n for n, _ in b], (a, b)
    for (_, x), (_, y) in zip(a, b):
        assert abs(x - y) <= 1e-5 * max(1.0, abs(x)), (a, b)


def _replay_refuses(model: Composed, plain: ModelHistory, drawn: list) -> bool:
    """Whether a site is one replay cannot act on: a module's input, or a write through a view."""
    return any(spelling == "module input" or (model.kinds[index] == "view write" and spelling in OP_SPELLINGS)
               for index, spelling, _, _ in drawn)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_cases())
def test_the_recorder_the_lean_capture_and_replay_agree_with_the_models_own_code(case: tuple) -> None:
    kinds, drawn, seed = case
    model, x = make(kinds, seed)
    with torch.no_grad():
        plain = torchlog.log_forward_pass(model, x, save_function_args=True)
    pairs = [(_site(model, plain, index, spelling, number), ACTIONS[name][0]) for index, spelling, number, name in drawn]
    want = _oracle(model, x, drawn)
    with torch.no_grad():
        logged = torchlog.log_forward_pass(model, x, intervene=pairs)
        lean = torchlog.run(model, x, intervene=pairs)
    torch.testing.assert_close(logged[-1].tensor_contents, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lean.output, want, rtol=1e-5, atol=1e-5)
    _same_firings(logged.interventions, lean.interventions)
    if _replay_refuses(model, plain, drawn):
        with pytest.raises(InterventionError):
            replay(plain, pairs)
        return
    with torch.no_grad():
        replayed = replay(plain, pairs)
    torch.testing.assert_close(replayed[-1].tensor_contents, want, rtol=1e-5, atol=1e-5)
    _same_firings(logged.interventions, replayed.interventions)
