"""Which pointer arguments a Triton kernel loads and stores through, read once from its source."""
from __future__ import annotations

import ast
import builtins
import inspect
import textwrap
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ArgAccess", "read_arg_access", "unwrap_kernel"]

_ATOMICS = frozenset(f"atomic_{op}" for op in ("add", "and", "cas", "max", "min", "or", "xchg", "xor"))
_WRITE_FUNCTIONS = _ATOMICS | {"store", "store_tensor_descriptor", "atomic_store"}
_WRITE_METHODS = _ATOMICS | {"store", "scatter"}
# Calls whose results are values read from memory: they point nowhere.
_READS = _ATOMICS | {"load", "load_tensor_descriptor", "atomic_load", "gather"}
_LOCAL = object()  # a name bound inside the kernel (a value, not a module or function)
_UNKNOWN = object()  # a name we cannot resolve


@dataclass(frozen=True, slots=True)
class ArgAccess:
    """Which parameters a kernel stores and loads through, as read from its source."""

    stores: tuple[frozenset[str], ...]  # per store: the parameters its pointer derives from
    read: frozenset[str]  # parameters some load's pointer derives from
    untraced: frozenset[str]  # parameters passed where we cannot follow them
    is_complete: bool  # every store was traced to at least one parameter

    @property
    def written(self) -> frozenset[str]:
        """Parameters some store's pointer derives from (integer ones included)."""
        return frozenset().union(*self.stores)


_UNREADABLE = ArgAccess((), frozenset(), frozenset(), False)
_access_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def read_arg_access(kernel: Any) -> ArgAccess:
    """Return which parameters `kernel` (a `@triton.jit` object or its function) writes.

    Results are cached per function. A kernel whose source cannot be read gives an
    access with `is_complete=False` (callers then compare contents instead); this
    never raises for a kernel Triton itself accepts.

    Example:
        >>> import triton.language as tl
        >>> def scale(x_ptr, out_ptr, n):
        ...     offsets = tl.arange(0, 16)
        ...     tl.store(out_ptr + offsets, 2 * tl.load(x_ptr + offsets), mask=offsets < n)
        >>> access = read_arg_access(scale)
        >>> sorted(access.written), sorted(access.read), access.is_complete
        (['out_ptr'], ['x_ptr'], True)
    """
    return _access_of(kernel, set())


def _access_of(kernel: Any, active: set) -> ArgAccess:
    fn = unwrap_kernel(kernel)
    if fn is None or fn in active:
        return _UNREADABLE  # not a Python kernel, or recursion (Triton rejects it anyway)
    source = getattr(_innermost(kernel), "src", None)  # JITFunction keeps its (editable) source
    cached = _access_cache.get(fn)
    if cached is not None and cached[0] == source:
        return cached[1]
    active.add(fn)
    try:
        access = _analyse(fn, source, active)
    finally:
        active.discard(fn)
    _access_cache[fn] = (source, access)
    return access


def _analyse(fn: Callable, source: str | None, active: set) -> ArgAccess:
    try:
        text = source if source is not None else inspect.getsource(fn)
        tree = ast.parse(textwrap.dedent(text))
    except (OSError, TypeError, SyntaxError):  # no source file (exec, REPL) or not Python
        return _UNREADABLE
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    if not defs:
        return _UNREADABLE
    return _SourceReader(fn, defs[0]).access(active)


class _SourceReader(ast.NodeVisitor):
    """Collects the data flow, memory accesses and calls of one kernel function."""

    def __init__(self, fn: Callable, node: ast.FunctionDef) -> None:
        self.params = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
        self.scope = dict(fn.__globals__) | _closure_of(fn)
        self.local_names = set(self.params) | {
            n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        self.flows: dict[str, set[str]] = {}  # name -> names its value was computed from
        self.sites: list[tuple[str, ast.expr | None]] = []  # ('write' | 'read', pointer)
        self.helpers: list[tuple[Any, ast.Call]] = []  # calls of other @triton.jit functions
        self.opaque: list[ast.Call] = []  # calls we cannot see into
        for statement in node.body:
            self.visit(statement)

    def access(self, active: set) -> ArgAccess:
        stores: list[frozenset[str]] = []
        read: set[str] = set()
        untraced: set[str] = set()
        for kind, pointer in self.sites:
            params = frozenset(self._params_of(pointer))
            if kind == "write":
                stores.append(params)
            else:
                read |= params
        complete = all(stores)  # a store through a pointer that derives from no parameter
        for callee, call in self.helpers:
            complete &= self._add_helper(callee, call, stores, read, untraced, active)
        for call in self.opaque:
            untraced |= self._params_of_args(call)
        return ArgAccess(tuple(dict.fromkeys(stores)), frozenset(read), frozenset(untraced), complete)

    def _add_helper(self, callee: Any, call: ast.Call, stores: list, read: set, untraced: set,
                    active: set) -> bool:
        """Map a helper's accesses onto ours; False when the helper writes untraceably."""
        inner = _access_of(callee, active)
        if not inner.is_complete:
            return False
        fn = unwrap_kernel(callee)
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            untraced |= self._params_of_args(call)
            return True
        bound = dict(zip(inspect.signature(fn).parameters, call.args)) | {
            k.arg: k.value for k in call.keywords}

        def outer(names: frozenset[str]) -> set[str]:
            return set().union(*(self._params_of(bound[n]) for n in names if n in bound))

        stores.extend(frozenset(outer(site)) for site in inner.stores)
        read |= outer(inner.read)
        untraced |= outer(inner.untraced)
        return all(outer(site) for site in inner.stores)

    def _params_of_args(self, call: ast.Call) -> set[str]:
        return set().union(*(self._params_of(a) for a in list(call.args) + [k.value for k in call.keywords]))

    def _params_of(self, expr: ast.expr | None) -> set[str]:
        """Parameters whose values flow into `expr`, through any chain of assignments."""
        if expr is None:
            return set()
        found: set[str] = set()
        seen: set[str] = set()
        stack = list(_names_in(expr))
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in self.params:
                found.add(name)
            stack.extend(self.flows.get(name, ()))
        return found

    # ----- visiting ----------------------------------------------------------------------------
    def _flow(self, target: ast.AST, sources: set[str]) -> None:
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                self.flows.setdefault(node.id, set()).update(sources)

    def visit_Assign(self, node: ast.Assign) -> None:
        sources = _names_in(node.value)
        for target in node.targets:
            self._flow(target, sources)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._flow(node.target, _names_in(node.value) | _names_in(node.target))
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._flow(node.target, _names_in(node.value))
        self.generic_visit(node)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self._flow(node.target, _names_in(node.value))
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        self._flow(node.target, _names_in(node.iter))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = _call_name(node)
        target = self._resolve(func)
        if isinstance(func, ast.Attribute) and self._resolve(func.value) is _LOCAL:
            # A method of a value: pointer tensors and tensor descriptors store this way.
            if name in _WRITE_METHODS:
                self.sites.append(("write", func.value))
            if name in _READS:
                self.sites.append(("read", func.value))
        elif _is_jit(target):
            self.helpers.append((target, node))
        elif _is_triton(target):
            pointer = node.args[0] if node.args else _keyword(node, "pointer", "desc")
            if name in _WRITE_FUNCTIONS:
                self.sites.append(("write", pointer))
            if name in _READS and name != "gather":  # tl.gather works on values
                self.sites.append(("read", pointer))
        elif not _is_builtin(target):
            self.opaque.append(node)
        self.generic_visit(node)

    def _resolve(self, expr: ast.expr) -> Any:
        if isinstance(expr, ast.Name):
            if expr.id in self.local_names:
                return _LOCAL
            if expr.id in self.scope:
                return self.scope[expr.id]
            return getattr(builtins, expr.id, _UNKNOWN)
        if isinstance(expr, ast.Attribute):
            owner = self._resolve(expr.value)
            if owner is _LOCAL or owner is _UNKNOWN:
                return owner
            return getattr(owner, expr.attr, _UNKNOWN)
        return _LOCAL  # the result of a call or subscript: a value


def _names_in(expr: ast.AST) -> set[str]:
    """Names an expression's value is computed from, skipping values loaded from memory."""
    found: set[str] = set()
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Call) and _call_name(node) in _READS:
            continue
        elif isinstance(node, ast.Attribute) and node.attr == "dtype":
            continue
        else:
            stack.extend(ast.iter_child_nodes(node))
    return found


def _call_name(node: ast.Call) -> str | None:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def _keyword(node: ast.Call, *names: str) -> ast.expr | None:
    return next((k.value for k in node.keywords if k.arg in names), None)


def _is_jit(obj: Any) -> bool:
    return type(obj).__name__ in ("JITFunction", "InterpretedFunction") and unwrap_kernel(obj) is not None


def _is_triton(obj: Any) -> bool:
    module = obj.__name__ if inspect.ismodule(obj) else getattr(obj, "__module__", None)
    return isinstance(module, str) and (module == "triton" or module.startswith("triton."))


def _is_builtin(obj: Any) -> bool:
    return getattr(obj, "__module__", None) == "builtins"


def _closure_of(fn: Callable) -> dict[str, Any]:
    cells = zip(fn.__code__.co_freevars, fn.__closure__ or ())
    values = {}
    for name, cell in cells:
        try:
            values[name] = cell.cell_contents
        except ValueError:  # a closure variable not assigned yet
            continue
    return values


def unwrap_kernel(kernel: Any) -> Callable | None:
    """Return the Python function under a JIT, interpreted, autotuned or heuristics kernel.

    A plain function is returned as is; an object with no Python function under it
    (a `CompiledKernel`, anything else) gives None rather than raising.

    Example:
        >>> def kernel(x_ptr):
        ...     pass
        >>> unwrap_kernel(kernel) is kernel, unwrap_kernel(object())
        (True, None)
    """
    inner = _innermost(kernel)
    return kernel if inspect.isfunction(kernel) else None if inner is None else inner.fn


def _innermost(kernel: Any) -> Any:
    """The kernel object whose `fn` is the Python function (JITFunction, InterpretedFunction)."""
    for _ in range(16):  # autotune(heuristics(jit(fn))) is three deep; stop on cycles
        fn = getattr(kernel, "fn", None)
        if fn is None:
            return None
        if inspect.isfunction(fn):
            return kernel
        kernel = fn
    return None
