"""Saved values that stay in a log file until read: what `PassRecord.saved` holds after loading."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import h5py
import torch

from torchlog.errors import LogFileError
from torchlog.records import LazyTensor
from torchlog.storage.files import HANDLE_LOCK, open_existing
from torchlog.storage.format import dtype_from_name, dtype_name
from torchlog.storage.values import read_value

__all__ = ["StoredValue", "StoredTensor", "stored_value", "dataset_value"]


class StoredValue(LazyTensor):
    """A value (tensor, or what activation_postfunc returned) in dataset `name` of `path`.

    Each `load()` opens the file, reads the value and closes the file again, so a loaded
    history holds no file handle and no tensor memory between accesses.
    """

    def __init__(self, path: str, log_id: str, name: str) -> None:
        self.path = path  # the HDF5 file
        self.log_id = log_id  # the file's `log_id` attribute: tells a replaced file apart
        self.name = name  # 'activations/12'

    def load(self) -> Any:
        """Read the value from the file.

        Raises:
            LogFileNotFoundError, LogFileError: the file was moved, replaced or damaged
                since the history was opened.
        """
        with HANDLE_LOCK, open_existing(self.path) as file:
            if file.attrs.get("log_id") != self.log_id:
                raise LogFileError(
                    f"{self.path!r} is not the log this history was read from any more (it was "
                    f"replaced: its log_id changed), so {self.name!r} cannot be read; load it again")
            obj = file.get(self.name)
            if obj is None:
                raise LogFileError(f"{self.path!r} has no {self.name!r}; the file is damaged")
            return read_value(obj, self.path)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} in {self.path!r}>"


class StoredTensor(StoredValue):
    """A tensor in a log file; shape, dtype and size are known without reading it."""

    def __init__(self, path: str, log_id: str, name: str, shape: tuple[int, ...],
                 dtype: torch.dtype) -> None:
        super().__init__(path, log_id, name)
        self.shape = torch.Size(shape)
        self.dtype = dtype

    def numel(self) -> int:
        return self.shape.numel()

    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def dim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        shape = tuple(self.shape)
        return f"<StoredTensor {self.name} {shape} {dtype_name(self.dtype)} in {self.path!r}>"


def stored_value(path: str, log_id: str, name: str, shape: Sequence[int] | None = None,
                 dtype: torch.dtype | None = None) -> StoredValue:
    """The lazy value of dataset `name`: a StoredTensor when its dtype is known (then its
    shape is too), else a StoredValue (what an activation_postfunc returned)."""
    if dtype is None:
        return StoredValue(path, log_id, name)
    return StoredTensor(path, log_id, name, tuple(shape or ()), dtype)


def dataset_value(path: str, log_id: str, name: str, obj: h5py.HLObject) -> StoredValue:
    """The lazy value of `obj`, the object `name` of the file: a tensor when it is a dataset
    that records its torch dtype."""
    if isinstance(obj, h5py.Dataset) and "torch_dtype" in obj.attrs:
        return stored_value(path, log_id, name, obj.shape, dtype_from_name(str(obj.attrs["torch_dtype"])))
    return stored_value(path, log_id, name)
