"""The batches of a dataset, and how each one is passed to the model."""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from torchlog.arguments import positional_args
from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError

__all__ = ["DATA_FORMS", "Data", "call_arguments"]

DATA_FORMS = ("a tensor (split along its first dimension with batch_size, else one batch), a "
              "list or other iterable of batches, or a torch DataLoader; a batch is a tensor, a "
              "tuple/list of forward's positional arguments, or a dict of its keyword arguments")


class Data:
    """The batches of `data`, checked before the model runs; iterate it for the batches
    in order. `num_batches` is None when the data has no length.

    Raises:
        InvalidArgumentTypeError: data of another type, or batch_size not a positive int.
        InvalidOptionError: data known to hold no batch (an empty tensor, list or DataLoader).

    Example:
        >>> [tuple(b.shape) for b in Data(torch.zeros(5, 2), batch_size=2)]
        [(2, 2), (2, 2), (1, 2)]
    """

    def __init__(self, data: Any, batch_size: int | None = None) -> None:
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                       or batch_size < 1):
            raise InvalidArgumentTypeError(f"batch_size must be None or a positive int, got {batch_size!r}")
        if isinstance(data, (str, bytes, Mapping)) or not isinstance(data, (torch.Tensor, Iterable)):
            raise InvalidArgumentTypeError(
                f"data of type {type(data).__name__} is not accepted; pass {DATA_FORMS}")
        if batch_size is not None and not isinstance(data, torch.Tensor):
            raise InvalidArgumentTypeError(
                f"batch_size={batch_size} splits a tensor; data of type {type(data).__name__} is "
                "already batches (use a DataLoader(dataset, batch_size=...) to batch samples)")
        self.data = data
        self.batch_size = batch_size
        self.num_batches = _num_batches(data, batch_size)
        if self.num_batches == 0:
            raise InvalidOptionError(f"data holds no batch ({_describe(data)}); pass at least one batch")

    def __iter__(self) -> Iterator[Any]:
        data = self.data
        if isinstance(data, torch.Tensor):
            if self.batch_size is None:
                yield data
            else:
                yield from data.split(self.batch_size)
            return
        yield from data

    def take(self, indexes: range) -> Iterator[tuple[int, Any]]:
        """(index, batch) for the batches whose index is in `indexes`, in order: a tensor is
        sliced and a list indexed directly; other data is read from its start, and the
        batches before `indexes` are read and dropped."""
        data = self.data
        if (isinstance(data, torch.Tensor) and self.batch_size is not None) or isinstance(data, Sequence):
            for index in range(indexes.start, min(indexes.stop, self.num_batches)):
                yield index, (data[index * self.batch_size:(index + 1) * self.batch_size]
                              if isinstance(data, torch.Tensor) else data[index])
            return
        for index, batch in enumerate(self):
            if index >= indexes.stop:
                return
            if index >= indexes.start:
                yield index, batch


def call_arguments(model: nn.Module, batch: Any, index: int) -> tuple[tuple, dict]:
    """(args, kwargs) to call `model` with for `batch` (number `index`, for messages).

    Raises:
        InvalidArgumentTypeError: a batch that is not a tensor, tuple, list or dict.
    """
    if isinstance(batch, torch.Tensor):
        return (batch,), {}
    if isinstance(batch, Mapping):
        return (), dict(batch)
    if isinstance(batch, (tuple, list)):
        return positional_args(model, batch), {}
    raise InvalidArgumentTypeError(f"batch {index} is {type(batch).__name__}; {DATA_FORMS}")


def _num_batches(data: Any, batch_size: int | None) -> int | None:
    if isinstance(data, torch.Tensor):
        if data.dim() == 0 and batch_size is not None:
            raise InvalidOptionError(f"batch_size={batch_size} cannot split a 0-dimensional tensor")
        if batch_size is None:
            return 1 if data.numel() or data.dim() == 0 else 0
        return -(-len(data) // batch_size)
    try:
        return len(data)
    except TypeError:  # an iterable without a length (a generator, an IterableDataset's loader)
        return None


def _describe(data: Any) -> str:
    if isinstance(data, torch.Tensor):
        return f"a tensor of shape {tuple(data.shape)}"
    return f"{type(data).__name__} of length 0"
