"""Naming the function behind an op, and finding the user code that called it, cheaply."""
from __future__ import annotations

import os
import sys
from bisect import bisect_right
from typing import Any

import torch

__all__ = ["CodeInfo", "call_site", "mark_boundary", "mark_user_code", "name_of", "site_text"]

# torch's package and torchlog's (two levels above this file): frames there are not user code.
_TORCHLOG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_INTERNAL_DIRS = (os.path.dirname(torch.__file__) + os.sep, _TORCHLOG_DIR + os.sep)
# The built-in example model lives in the package but is user code: its lines are call sites.
_USER_FILES = (os.path.join(_TORCHLOG_DIR, "demo.py"),)
_BOUNDARY = 2  # CodeInfo.internal of the frame that runs the model: nothing above it is in the pass


class CodeInfo:
    """One code object as call sites name it: made once per code object and kept.

    A call site holds this, not the code object, because a code object's hash is worked
    out afresh on every use from its bytecode, names and constants (about 1 µs): a site
    is hashed at every op's walk and again when ops are grouped into layers. This one
    hashes by identity. `internal` is True for torch and torchlog code, False for user
    code, and `_BOUNDARY` for the frame that runs the model.

    A site keeps the instruction offset, not the line: `frame.f_lineno` decodes the code's
    line table from its start on every read (3.9 us per op at line 400 of a forward), so
    lines are looked up once per site, when assembly writes the call site's text.
    """

    __slots__ = ("code", "internal", "co_filename", "co_name", "co_firstlineno", "_starts", "_lines")

    def __init__(self, code: Any, internal: Any) -> None:
        self.code, self.internal = code, internal
        self.co_filename, self.co_name, self.co_firstlineno = code.co_filename, code.co_name, code.co_firstlineno
        self._starts: list[int] | None = None  # first offset of each run of one line, ascending
        self._lines: list[int | None] = []

    def line_at(self, offset: int) -> int | None:
        """The source line of the instruction at byte `offset` (a frame's `f_lasti`)."""
        starts = self._starts
        if starts is None:  # built whole, then published: another thread may read it meanwhile
            runs = list(self.code.co_lines())
            self._lines = [line for _, _, line in runs]
            self._starts = starts = [start for start, _, _ in runs]
        i = bisect_right(starts, offset) - 1
        return self._lines[i] if i >= 0 else None

    def __repr__(self) -> str:
        return f"<CodeInfo {self.co_name} at {self.co_filename}:{self.co_firstlineno}>"


# id(code object) -> its CodeInfo, which holds the code object alive, so the id stays its own.
_codes: dict[int, CodeInfo] = {}


def _learn(code: Any, internal: Any = None) -> CodeInfo:
    if internal is None:
        internal = code.co_filename.startswith(_INTERNAL_DIRS) and code.co_filename not in _USER_FILES
    info = _codes[id(code)] = CodeInfo(code, internal)
    return info


def call_site(stop: Any = None, stop_site: tuple | None = None, start: Any = None) -> tuple | None:
    """(CodeInfo, instruction offset) of the nearest frame outside torch and torchlog: where
    user code called the op (`CodeInfo.line_at(offset)` is its line).

    None when no user code runs between the model's call and the op (a model built only
    of torch modules). A handful of frame hops with a per-code cache: cheap enough to do
    per op, unlike `inspect.stack()`, which reads source files; the walk stops at the
    frame that called the model (see `mark_boundary`), never climbing the caller's stack.
    Reaching frame `stop` (the one running the innermost module's forward) answers
    `stop_site`, the module's own call site, found by the same walk when it was entered.
    The walk starts at frame `start`, by default the caller of call_site's caller.
    """
    frame = sys._getframe(2) if start is None else start
    codes = _codes
    while frame is not None:
        if frame is stop:
            return stop_site
        code = frame.f_code
        info = codes.get(id(code))
        if info is None:
            info = _learn(code)
        internal = info.internal
        if not internal:
            # The instruction offset tells apart two ops on one line (`x + a + b`).
            return (info, frame.f_lasti)
        if internal is _BOUNDARY:
            return None
        frame = frame.f_back
    return None


def mark_boundary(code: Any) -> None:
    """Stop call-site walks at frames running `code` (the torchlog function that calls the model)."""
    _learn(code, _BOUNDARY)


def mark_user_code(code: Any) -> None:
    """Treat frames running `code` as user code: their instructions are call sites."""
    _learn(code, False)


def name_of(func: Any) -> str:
    """The op name of a torch function, method or property getter (`add`, `__add__`, `T`)."""
    name = getattr(func, "__name__", None)
    if name in ("__get__", "__set__"):  # property access such as `x.T`
        owner = getattr(func, "__self__", None)
        name = getattr(owner, "__name__", name)
    return name or type(func).__name__


def site_text(site: tuple) -> str:
    """'file.py:42 in forward' for a (code, offset) call site."""
    code, offset = site
    return f"{code.co_filename}:{code.line_at(offset)} in {code.co_name}"
