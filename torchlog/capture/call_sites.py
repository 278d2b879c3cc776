"""Naming the function behind an op, and finding the user code that called it, cheaply."""
from __future__ import annotations

import os
import sys
from typing import Any

import torch

__all__ = ["call_site", "mark_boundary", "mark_user_code", "name_of"]

# torch's package and torchlog's (two levels above this file): frames there are not user code.
_TORCHLOG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_INTERNAL_DIRS = (os.path.dirname(torch.__file__) + os.sep, _TORCHLOG_DIR + os.sep)
# The built-in example model lives in the package but is user code: its lines are call sites.
_USER_FILES = (os.path.join(_TORCHLOG_DIR, "demo.py"),)
# code object -> True (torch or torchlog), False (user code) or _BOUNDARY (the frame that
# runs the model: nothing above it is inside the forward pass).
_internal_code: dict[Any, Any] = {}
_BOUNDARY = 2


def call_site(stop: Any = None, stop_site: tuple | None = None) -> tuple | None:
    """(code, instruction offset, line) of the nearest frame outside torch and torchlog: where user code called the op.

    None when no user code runs between the model's call and the op (a model built only
    of torch modules). A handful of frame hops with a per-code cache: cheap enough to do
    per op, unlike `inspect.stack()`, which reads source files; the walk stops at the
    frame that called the model (see `mark_boundary`), never climbing the caller's stack.
    Reaching frame `stop` (the one running the innermost module's forward) answers
    `stop_site`, the module's own call site, found by the same walk when it was entered.
    """
    frame = sys._getframe(2)
    while frame is not None:
        if frame is stop:
            return stop_site
        code = frame.f_code
        internal = _internal_code.get(code)
        if internal is None:
            internal = _internal_code[code] = (code.co_filename.startswith(_INTERNAL_DIRS)
                                               and code.co_filename not in _USER_FILES)
        if not internal:
            # The instruction offset tells apart two ops on one line (`x + a + b`).
            return (code, frame.f_lasti, frame.f_lineno)
        if internal is _BOUNDARY:
            return None
        frame = frame.f_back
    return None


def mark_boundary(code: Any) -> None:
    """Stop call-site walks at frames running `code` (the torchlog function that calls the model)."""
    _internal_code[code] = _BOUNDARY


def mark_user_code(code: Any) -> None:
    """Treat frames running `code` as user code: their instructions are call sites."""
    _internal_code[code] = False


def name_of(func: Any) -> str:
    """The op name of a torch function, method or property getter (`add`, `__add__`, `T`)."""
    name = getattr(func, "__name__", None)
    if name in ("__get__", "__set__"):  # property access such as `x.T`
        owner = getattr(func, "__self__", None)
        name = getattr(owner, "__name__", name)
    return name or type(func).__name__
