"""Re-running one logged op on saved values, in the state it ran in, and comparing two results."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from torchlog.capture import OP_CONTEXT_KEY, find_tensors, returns_nothing_but_writes, rng_restored
from torchlog.records import PassRecord

__all__ = ["SETITEM", "is_continuous", "op_context", "replaced", "rerun", "value_mismatch"]

SETITEM = torch.Tensor.__setitem__


def rerun(record: PassRecord, values: dict[str, Any],
          swap: tuple[str, torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Re-run the op with each parent's saved value (or `swap`'s) where its tensor was.

    Every parent gets one fresh clone, shared by all the slots it filled, so in-place
    ops cannot touch the saved values and `x + x` still passes one tensor twice.
    Returns every tensor of the result, in the order capture numbered them.

    Raises:
        Whatever the op raises on the replacement values.
    """
    func, args, kwargs = record.func_args
    slots = {"args": list(args), "kwargs": dict(kwargs)}
    clones: dict[str, torch.Tensor] = {}
    for edge in record.parents:
        if edge.label not in clones:
            source = swap[1] if swap is not None and swap[0] == edge.label else values[edge.label]
            clones[edge.label] = source.clone()
        _put(slots, edge.arg, clones[edge.label])
    with op_context(record.extra.get(OP_CONTEXT_KEY)), rng_restored(record.rng_state):
        out = func(*slots["args"], **slots["kwargs"])
    if returns_nothing_but_writes(func):  # `t[i] = v`, `t.data = v`: the result is `t`
        return [slots["args"][0]]
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for t, _ in find_tensors(out)]


def _put(slots: dict[str, Any], arg: Any, value: torch.Tensor) -> None:
    """Place `value` at argument slot `arg`: an int, a kwarg name, or a path into a container."""
    path = arg if isinstance(arg, tuple) else (arg,)
    head = path[0]
    container = slots["args"] if isinstance(head, int) else slots["kwargs"]
    container[head] = replaced(container[head], path[1:], value)


def replaced(old: Any, path: tuple, value: torch.Tensor) -> Any:
    """`old` with `value` at `path` (indexes and keys into nested containers).

    Copies each container on the path, so the recorded arguments stay as they were.
    """
    if not path:
        return value
    key, rest = path[0], path[1:]
    if isinstance(old, dict):
        new = dict(old)
        new[key] = replaced(old[key], rest, value)
        return new
    items = list(old)
    items[key] = replaced(old[key], rest, value)
    if isinstance(old, list):
        return items
    return type(old)(*items) if hasattr(old, "_fields") else type(old)(items)


@contextlib.contextmanager
def op_context(context: dict | None) -> Iterator[None]:
    """Run in the grad mode, inference mode and autocast state an op was logged in.

    `context` is what capture stored under `extra['op_context']`: None for the usual
    state (grad mode on, inference mode and autocast off), else the keys that differed:
    `grad` (False), `inference` (True), `autocast` ({device type: dtype name}).
    """
    context = context or {}
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.set_grad_enabled(bool(context.get("grad", True))))
        if context.get("inference", False):
            stack.enter_context(torch.inference_mode())
        for device, dtype in context.get("autocast", {}).items():
            stack.enter_context(torch.autocast(device, dtype=getattr(torch, dtype)))
        yield


def is_continuous(t: torch.Tensor) -> bool:
    """Whether `t` holds floating point or complex values (compared with a tolerance)."""
    return t.is_floating_point() or t.is_complex()


# ----- comparing -----------------------------------------------------------------------------
def value_mismatch(saved: Any, other: Any) -> tuple[str, float | None] | None:
    """None when `other` equals `saved` (within float tolerance), else (why, max difference)."""
    if not isinstance(saved, torch.Tensor) or not isinstance(other, torch.Tensor):
        return (f"expected a tensor, got {type(other).__name__} vs {type(saved).__name__}", None)
    if saved.shape != other.shape:
        return (f"shape {tuple(other.shape)} instead of {tuple(saved.shape)}", None)
    if saved.dtype != other.dtype:
        return (f"dtype {other.dtype} instead of {saved.dtype}", None)
    saved, other = saved.detach(), other.detach().to(saved.device)
    if not is_continuous(saved):
        if torch.equal(saved, other):
            return None
        return ("values differ", float((saved.double() - other.double()).abs().max()))
    rtol, atol = (1e-2, 1e-3) if saved.element_size() <= 2 else (1e-4, 1e-5)
    if torch.allclose(saved, other, rtol=rtol, atol=atol, equal_nan=True):
        return None
    diff = (saved - other).abs().double()
    same = (saved == other) | (torch.isnan(saved) & torch.isnan(other))
    diff = torch.where(same, torch.zeros_like(diff), diff.nan_to_num(nan=float("inf")))
    return ("values differ", float(diff.max()))

