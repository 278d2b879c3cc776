"""Ops inside torch.nn.functional functions written in Python: each call a scope of its own ops.

A Python functional (`F.multi_head_attention_forward`, `F.normalize`) begins with a dispatch
guard that hands the whole call to the capture mode, and the mode runs it with itself popped,
so the ops of its body would be unseen. For such a function the recorder runs a copy whose
guard is off (the same code with `has_torch_function*` answering False in its own globals;
torch itself is not changed) with the mode pushed again, so each torch call of the body is
an op. Each op of the body names the call in `extra['functionals']`
(`self_attn.multi_head_attention_forward:1`, like a module call; functionals are not modules,
so they stay out of `history.modules`). A call whose body ran one op is recorded exactly as
the single op it was before, and from then on that function runs unexpanded in this process
(no cost on `F.relu`).
"""
from __future__ import annotations

import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchlog.capture.call_sites import call_site, mark_user_code
from torchlog.capture.rng import rng_state

if TYPE_CHECKING:  # the recorder imports this module
    from torchlog.capture.recorder import Recorder

__all__ = ["FUNCTIONAL_KEY", "expandable_body", "run_expanded"]

# RawNode.extra key: the functional calls an op ran inside, innermost first ('normalize:1').
FUNCTIONAL_KEY = "functionals"

_GUARDS = ("has_torch_function", "has_torch_function_unary", "has_torch_function_variadic")
_bodies: dict[Any, Callable | None] = {}  # function -> its guard-free copy, or None


def _no_torch_function(*args: Any) -> bool:
    return False


def expandable_body(func: Any) -> Callable | None:
    """A copy of `func` whose dispatch guard is off, if it is a Python functional; else None."""
    body = _bodies.get(func, False)
    if body is not False:
        return body
    body = None
    code = getattr(func, "__code__", None)
    if (isinstance(func, types.FunctionType) and func.__module__ == "torch.nn.functional"
            and any(name in code.co_names for name in _GUARDS)):
        namespace = dict(func.__globals__)  # a snapshot: F's own module stays as it is
        namespace.update(dict.fromkeys(_GUARDS, _no_torch_function))
        # A code object of its own (an unused constant makes it unequal to the original), so
        # the body's instructions are call sites that tell its ops apart, while the original
        # stays torch-internal and a call of it is sited at the user's line.
        code = code.replace(co_consts=code.co_consts + ("torchlog: guard-free copy",))
        mark_user_code(code)
        body = types.FunctionType(code, namespace, func.__name__, func.__defaults__, func.__closure__)
        body.__kwdefaults__ = func.__kwdefaults__
    _bodies[func] = body
    return body


def run_expanded(recorder: Recorder, func: Callable, name: str, body: Callable,
                 args: tuple, kwargs: dict) -> Any:
    """Run `body` (func's guard-free copy) with the mode on, as one scope of `recorder`."""
    parents, params = recorder._find_parents(args, kwargs)  # what a one-op record would list
    rng = rng_state(recorder._rng_before, args, kwargs) if recorder.options.save_function_args else None
    site = (recorder._call_site(), recorder.module_sites)
    first_node, first_call = len(recorder.nodes), recorder._call_count
    recorder.expanding.add(func)
    try:
        with recorder.mode:  # the body's torch calls reach the mode again
            out = body(*args, **kwargs)
    finally:
        recorder.expanding.discard(func)
    if recorder._call_count - first_call >= 2:
        _mark_scope(recorder, first_node, name)
        return out
    recorder.collapse(func)  # one op: from now on the function runs as that one op
    if recorder._call_count == first_call:  # nothing recorded (the body returned an input)
        return recorder.record_call(func, name, args, kwargs, out, parents, params, rng)
    recorder.rename_call(first_node, name, (func, args, kwargs), parents, params, rng, site)
    return out


def _mark_scope(recorder: Recorder, first_node: int, name: str) -> None:
    """Name the scope ('attn.multi_head_attention_forward:1') in each node made since
    `first_node`, after the scopes of functionals it ran itself (innermost first)."""
    stack = recorder.module_stack
    address = f"{stack[-1][0]}.{name}" if stack else name
    count = recorder.scope_calls[address] = recorder.scope_calls.get(address, 0) + 1
    scope = f"{address}:{count}"
    for node in recorder.nodes[first_node:]:
        if node.extra is None:
            node.extra = {}
        node.extra.setdefault(FUNCTIONAL_KEY, []).append(scope)
