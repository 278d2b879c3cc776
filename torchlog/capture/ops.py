"""What is an op: the one description of torch calls that the recorder and the lean capture share.

Both capture paths number ops the same way (`RawNode.call_id` in the recorder, the call
count of the lean capture), so a plan made from one pass can act on the other: they must
agree on which calls are ops, which write into their first argument, which return the
tensor they wrote (`t[i] = v`, `t.data = v` return None), and which Python functionals
run as a scope of their own ops. Everything here is decided once per function and cached
for the process.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from torchlog.capture.call_sites import name_of
from torchlog.capture.functionals import expandable_body
from torchlog.capture.nesting import find_tensors
from torchlog.capture.writes import DATA_SET, SETITEM, returns_nothing_but_writes

__all__ = ["PASS_THROUGH", "UNDEFINED_VALUES", "OpDescription", "collapse", "describe", "output_tensors"]

# Calls that never produce a node: metadata reads (answered without scanning arguments)
# and tensor-returning calls that change bookkeeping, not values.
_NOT_OPS = frozenset({
    "requires_grad_", "retain_grad", "register_hook", "grad", "_fix_weakref",
    "shape", "dtype", "device", "dim", "ndim", "size", "numel", "nelement", "stride", "storage_offset",
    "is_contiguous", "data_ptr", "element_size", "is_floating_point", "is_complex", "get_device",
    "requires_grad", "grad_fn", "is_leaf", "layout", "names", "is_cuda", "is_sparse", "is_quantized",
    "is_meta", "is_inference", "__len__", "__repr__", "__format__", "__hash__", "untyped_storage",
    "_version", "_base", "is_nested", "output_nr", "__dlpack_device__",
})
_INPLACE_DUNDERS = frozenset(
    f"__i{op}__" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul",
                            "and", "or", "xor", "lshift", "rshift")
)
# Results that are never tensors: a call returning one of these records nothing.
_PLAIN = (bool, int, float, torch.Size, torch.dtype, str)

# Factories of uninitialised memory: their values are whatever the allocator left there, so no
# run reproduces them and no watch (stop_on) reads them (a NaN there is garbage, not a result).
UNDEFINED_VALUES = frozenset({"empty", "empty_like", "new_empty", "empty_strided"})


class OpDescription(NamedTuple):
    """How capture treats one torch function (a tuple: unpacked on the hot path)."""

    name: str  # the op's name ('linear', '__add__', 'set_data')
    not_op: bool  # a metadata read or bookkeeping call: run, never recorded
    writes_first_arg: bool  # writes into its first argument, by its name
    body: Callable | None  # a Python functional's guard-free body, run as a scope; or None
    inplace_slot: int | None  # position of an `inplace` parameter, or None


# function -> its description. A Python functional whose body ran a single op is stored
# with no body from then on (`collapse`): it runs as that one op.
DESCRIPTIONS: dict[Any, OpDescription] = {}
# The functions described so far that are not ops (metadata reads such as `Tensor.size`):
# the capture mode runs them straight away, without calling the recorder.
PASS_THROUGH: set[Any] = set()


def describe(func: Callable) -> OpDescription:
    """The description of `func`, made on its first call and cached for the process.

    Example:
        >>> describe(torch.Tensor.add_).writes_first_arg, describe(torch.Tensor.size).not_op
        (True, True)
    """
    entry = DESCRIPTIONS.get(func)
    if entry is not None:
        return entry
    name = "set_data" if func == DATA_SET else name_of(func)  # `t.data = v`, not a `.data` read
    inplace = (name[-1:] == "_" and name[:1] != "_") or name in _INPLACE_DUNDERS or func is SETITEM \
        or name == "set_data"
    # torch.autograd.grad shares its name with the Tensor.grad attribute but computes tensors.
    entry = OpDescription(name, name in _NOT_OPS and func is not torch.autograd.grad, inplace,
                          expandable_body(func), _inplace_parameter(func))
    DESCRIPTIONS[func] = entry
    if entry.not_op:
        PASS_THROUGH.add(func)
    return entry


def collapse(func: Callable) -> None:
    """Run the Python functional `func` as one op from now on, in this process (its body ran one op)."""
    DESCRIPTIONS[func] = describe(func)._replace(body=None)


def output_tensors(func: Callable, args: tuple, out: Any) -> tuple:
    """The (tensor, path) pairs an op's call produced, as both capture paths count them:
    the tensors in what it returned, or the tensor a None-returning write wrote into;
    () when the call made no tensor (then it is not an op of the pass)."""
    if isinstance(out, torch.Tensor):
        return ((out, ()),)
    if out is None:
        return ((args[0], ()),) if returns_nothing_but_writes(func) else ()
    if isinstance(out, _PLAIN):
        return ()
    return tuple(find_tensors(out))


def _inplace_parameter(func: Callable) -> int | None:
    """Position of the `inplace` parameter of a Python function (`F.relu(x, inplace=True)`)."""
    code = getattr(func, "__code__", None)
    if code is None:
        return None
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    return names.index("inplace") if "inplace" in names else None
