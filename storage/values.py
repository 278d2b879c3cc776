"""Writing one saved value (tensor, array, number, string, or a container of them) to HDF5.

Tensors and arrays become datasets; lists, tuples and str-keyed dicts become groups with
one member per item. A tensor's dataset has a `torch_dtype` attribute; every other object
has a `kind` attribute saying how to read it back, so reading never runs code. Anything
else is refused with an error naming the value.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np
import torch
from h5py import h5a, h5d, h5s, h5t

from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError, LogFileError
from torchlog.storage.format import (
    array_to_tensor,
    chunk_shape,
    contiguous,
    dtype_from_name,
    dtype_name,
    tensor_to_array,
)

__all__ = ["WriteOptions", "set_text_attrs", "describe", "write_value", "read_value"]

_SCALARS = (bool, int, float, complex)
_STR = h5py.string_dtype()
_VLEN_STR = h5t.py_create(_STR, logical=True)
_SCALAR_SPACE = h5s.create(h5s.SCALAR)
_ACCEPTED = ("a tensor, a numpy array or scalar, a bool/int/float/complex, a str, None, "
             "or a list, tuple or str-keyed dict of those")


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """How datasets are written: compression ('gzip', 'lzf' or None) and the gzip level."""

    compression: str | None = None
    compression_opts: int | None = None

    def __post_init__(self) -> None:
        if self.compression not in (None, "gzip", "lzf"):
            raise InvalidOptionError(
                f"compression must be None, 'gzip' or 'lzf', got {self.compression!r}")
        if self.compression_opts is not None and self.compression != "gzip":
            raise InvalidOptionError(
                f"compression_opts={self.compression_opts!r} is only accepted with "
                "compression='gzip' (a level 0..9)")


def set_text_attrs(obj: h5py.HLObject, values: dict[str, str]) -> None:
    """Add string attributes through the low-level API: about half the cost of `obj.attrs[...]`,
    which matters once per streamed activation. h5py reads them back as str."""
    for name, value in values.items():
        attr = h5a.create(obj.id, name.encode(), _VLEN_STR, _SCALAR_SPACE)
        attr.write(np.array(value, dtype=_STR))


def describe(value: Any) -> dict[str, Any]:
    """What the metadata records about a saved value, so loading need not open its dataset."""
    if isinstance(value, torch.Tensor):
        return {"kind": "tensor", "shape": list(value.shape), "dtype": dtype_name(value.dtype)}
    return {"kind": "value"}


def write_value(group: h5py.Group, name: str, value: Any, what: str,
                options: WriteOptions) -> h5py.HLObject:
    """Write `value` as `group[name]` and return the new dataset or group.

    Raises:
        InvalidArgumentTypeError: the value (or an item inside it) cannot be stored;
            `what` names it in the message, with the accepted types.
    """
    if isinstance(value, torch.Tensor):
        obj = _write_array(group, name, tensor_to_array(value, what), options)
        set_text_attrs(obj, {"torch_dtype": dtype_name(value.dtype)})  # marks a tensor
        return obj
    if isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
        if array.dtype.hasobject or array.dtype.kind in "USV":
            raise InvalidArgumentTypeError(
                f"{what} is a numpy value of dtype {array.dtype}, which cannot be stored; "
                "use a numeric or bool array")
        obj = _write_array(group, name, contiguous(array), options)
        obj.attrs["kind"] = "ndarray" if isinstance(value, np.ndarray) else "numpy_scalar"
        return obj
    return _write_python(group, name, value, what, options)


def _write_array(group: h5py.Group, name: str, array: np.ndarray, options: WriteOptions) -> h5py.Dataset:
    """Chunked and filtered with compression; else contiguous, which writes about 1.5 times as
    fast (docs/storage.md) and reads any slice without a chunk index."""
    chunks = chunk_shape(array.shape, array.itemsize)
    if options.compression is not None and chunks is not None:  # 0-d/empty cannot be chunked
        return group.create_dataset(name, data=array, chunks=chunks, compression=options.compression,
                                    compression_opts=options.compression_opts)
    # The low-level API: a third of create_dataset's overhead, paid once per activation.
    space = h5s.create_simple(array.shape) if array.ndim else h5s.create(h5s.SCALAR)
    dataset = h5d.create(group.id, name.encode(), h5t.py_create(array.dtype, logical=True), space)
    if array.size:
        dataset.write(h5s.ALL, h5s.ALL, array)
    return h5py.Dataset(dataset)


def _write_python(group: h5py.Group, name: str, value: Any, what: str,
                  options: WriteOptions) -> h5py.HLObject:
    if value is None:
        obj = group.create_dataset(name, data=h5py.Empty("f"))
        obj.attrs["kind"] = "none"
    elif isinstance(value, _SCALARS):
        if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**63:
            raise InvalidArgumentTypeError(f"{what} is the int {value!r}, too large for int64")
        obj = group.create_dataset(name, data=value)
        obj.attrs["kind"] = "scalar"
        obj.attrs["py_type"] = type(value).__name__ if type(value) in _SCALARS else _base_scalar(value)
    elif isinstance(value, str):
        obj = group.create_dataset(name, data=value, dtype=h5py.string_dtype())
        obj.attrs["kind"] = "str"
    elif isinstance(value, (list, tuple)):
        obj = group.create_group(name)
        obj.attrs["kind"] = "tuple" if isinstance(value, tuple) else "list"
        for i, item in enumerate(value):
            write_value(obj, str(i), item, f"{what}[{i}]", options)
    elif isinstance(value, dict) and all(isinstance(k, str) for k in value):
        obj = group.create_group(name)
        obj.attrs["kind"] = "dict"
        obj.attrs["keys"] = json.dumps(list(value))  # keys may hold '/', not allowed in names
        for i, (key, item) in enumerate(value.items()):
            write_value(obj, str(i), item, f"{what}[{key!r}]", options)
    else:
        raise InvalidArgumentTypeError(
            f"{what} is {_short(value)} of type {type(value).__name__}, which cannot be written "
            f"to an HDF5 log; activation_postfunc may return {_ACCEPTED}")
    return obj


def _base_scalar(value: Any) -> str:
    return next(t.__name__ for t in _SCALARS if isinstance(value, t))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_value(obj: h5py.HLObject, path: str) -> Any:
    """Read back a value `write_value` wrote.

    Raises:
        LogFileError: the object has no known `kind` (the file is damaged or foreign);
            `path` (the file) and the object's name are in the message.
    """
    kind = obj.attrs.get("kind", "tensor" if "torch_dtype" in obj.attrs else None)
    if kind == "tensor":
        try:
            return array_to_tensor(obj[...], dtype_from_name(str(obj.attrs["torch_dtype"])))
        except ValueError as exc:
            raise LogFileError(f"{obj.name!r} in {path!r} is damaged: {exc}") from exc
    if kind == "ndarray":
        return obj[...]
    if kind == "numpy_scalar":
        return obj[()]
    if kind == "none":
        return None
    if kind == "scalar":
        return {"bool": bool, "int": int, "float": float, "complex": complex}[str(obj.attrs["py_type"])](obj[()])
    if kind == "str":
        return obj.asstr()[()]
    if kind in ("list", "tuple"):
        items = [read_value(obj[str(i)], path) for i in range(len(obj))]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        keys = json.loads(obj.attrs["keys"])
        return {key: read_value(obj[str(i)], path) for i, key in enumerate(keys)}
    raise LogFileError(
        f"{obj.name!r} in {path!r} has kind {kind!r}; expected one of tensor, ndarray, numpy_scalar, "
        "none, scalar, str, list, tuple, dict (is the file damaged or from another program?)")
