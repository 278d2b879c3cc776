"""Cutting extract inputs into batches numbered in a fixed order, and which of them a rank takes.

Batch `i` always holds the same samples, whatever the number of processes: with a
`batch_size`, samples `i * batch_size` up to `(i + 1) * batch_size`. A rank takes one
contiguous block of batches, so its shard maps onto one block of rows of the joined file.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset

from torchlog.capture import find_tensors
from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError

__all__ = ["Batches", "batch_len"]


class Batches:
    """The batches of an extract's inputs.

    Accepted: a tensor (split along its first axis with `batch_size`, else one batch); a
    sized, indexable dataset of samples with `batch_size` (only the samples of the batches
    loaded are read); any other iterable of samples with `batch_size`; an iterable of
    batches without it. Samples are tensors or tuples/lists of tensors, stacked per batch.
    """

    def __init__(self, inputs: Any, batch_size: int | None) -> None:
        """Check the inputs; load nothing.

        Raises:
            InvalidOptionError: batch_size is not None or a positive int.
            InvalidArgumentTypeError: inputs are not a tensor or an iterable.
        """
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                       or batch_size < 1):
            raise InvalidOptionError(f"batch_size must be None or a positive int, got {batch_size!r}")
        if not isinstance(inputs, (torch.Tensor, Iterable)) and not _indexable(inputs):
            raise InvalidArgumentTypeError(
                f"inputs must be a tensor, a dataset, an iterable of batches or a DataLoader, got {inputs!r}")
        self.inputs = inputs
        self.batch_size = batch_size
        self._reference: tuple | None = None  # (sample index, shapes) every sample must match
        length = _length(inputs)
        if isinstance(inputs, torch.Tensor):
            length = len(inputs) if batch_size else 1
        self.num_samples = length if batch_size else None
        self.num_batches = (length if not batch_size or length is None else -(-length // batch_size))
        self.is_indexable = batch_size is not None and (isinstance(inputs, torch.Tensor) or _indexable(inputs))

    def size(self, index: int) -> int | None:
        """Samples in batch `index`, when known without loading it."""
        if self.num_samples is None or not self.is_indexable:
            return None
        return min(self.batch_size, self.num_samples - index * self.batch_size)

    def num_samples_in(self, indexes: range) -> int | None:
        """Samples in the batches `indexes`, when known without loading them."""
        if self.num_samples is None or not self.is_indexable:
            return None
        return max(0, min(self.num_samples, indexes.stop * self.batch_size) - indexes.start * self.batch_size)

    def share(self, rank: int, world_size: int) -> range:
        """The batch indexes rank `rank` of `world_size` takes: one contiguous block.

        Raises:
            InvalidArgumentTypeError: several processes, and the number of batches is unknown.
        """
        if world_size == 1 and self.num_batches is None:
            return range(0, 1 << 62)
        if self.num_batches is None:
            raise InvalidArgumentTypeError(
                f"a distributed extract needs inputs of known length to share them among "
                f"{world_size} processes, got {type(self.inputs).__name__} without len(); pass "
                "a Dataset (with __len__ and __getitem__) or a tensor, with batch_size")
        return range(rank * self.num_batches // world_size, (rank + 1) * self.num_batches // world_size)

    def load(self, indexes: range, skip: int = 0) -> Iterator[tuple[int, Any]]:
        """Yield (index, batch) for the batches in `indexes`, in order.

        The first `skip` of them (written by an earlier run) come as (index, None) when
        `size(index)` knows their size, so they are never read; else they are loaded too.

        Raises:
            InvalidOptionError: a sample's shapes differ from the first sample's.
            InvalidArgumentTypeError: samples that are not tensors or tuples of tensors.
        """
        if isinstance(self.inputs, torch.Tensor) or self.is_indexable:
            for i in indexes:
                if i >= self.num_batches:
                    return
                yield i, (None if i - indexes.start < skip and self.size(i) is not None else self._get(i))
            return
        for i, batch in enumerate(self._iterate()):
            if i >= indexes.stop:
                return
            if i >= indexes.start:
                yield i, batch

    def _get(self, index: int) -> Any:
        if isinstance(self.inputs, torch.Tensor):
            if not self.batch_size:
                return self.inputs
            return self.inputs[index * self.batch_size:(index + 1) * self.batch_size]
        first = index * self.batch_size
        return self._stack(first, [self.inputs[j] for j in range(first, first + self.size(index))])

    def _iterate(self) -> Iterator[Any]:
        if self.batch_size is None:
            yield from self.inputs
            return
        group: list[Any] = []
        first = 0
        for sample in self.inputs:
            group.append(sample)
            if len(group) == self.batch_size:
                yield self._stack(first, group)
                first, group = first + len(group), []
        if group:
            yield self._stack(first, group)

    def _stack(self, first: int, samples: list[Any]) -> Any:
        """One batch from samples `first`, `first + 1`, ... of the inputs."""
        for offset, sample in enumerate(samples):
            self._check_sample(first + offset, sample)
        head = samples[0]
        if isinstance(head, torch.Tensor):
            return torch.stack(samples)
        return type(head)(torch.stack(column) for column in zip(*samples))

    def _check_sample(self, index: int, sample: Any) -> None:
        if isinstance(sample, torch.Tensor):
            shapes: tuple = (tuple(sample.shape),)
        elif isinstance(sample, (tuple, list)) and sample and all(isinstance(x, torch.Tensor) for x in sample):
            shapes = tuple(tuple(x.shape) for x in sample)
        else:
            raise InvalidArgumentTypeError(
                f"with batch_size, samples must be tensors or tuples of tensors; sample {index} "
                f"is {type(sample).__name__}")
        if self._reference is None:
            self._reference = (index, shapes)
        elif shapes != self._reference[1]:
            where, expected = self._reference
            raise InvalidOptionError(
                f"sample {index} has shape {_text(shapes)}, but sample {where} has {_text(expected)}; "
                "extract stacks samples into batches of one array per layer, so every sample "
                "needs the same shape: pad or crop them")


def batch_len(batch: Any) -> int:
    """The number of samples in a batch: the first axis of its first tensor.

    Raises:
        InvalidArgumentTypeError: the batch holds no tensor with a first axis.
    """
    found = find_tensors(batch)
    if not found or found[0][0].dim() == 0:
        raise InvalidArgumentTypeError(
            f"cannot tell the number of samples in batch {batch!r}: it holds no tensor with a "
            "first (sample) axis")
    return found[0][0].shape[0]


def _indexable(inputs: Any) -> bool:
    return (hasattr(inputs, "__getitem__") and _length(inputs) is not None
            and not isinstance(inputs, (IterableDataset, str, bytes, dict)))


def _length(inputs: Any) -> int | None:
    try:
        return len(inputs)
    except TypeError:
        return None


def _text(shapes: tuple) -> str:
    return str(shapes[0]) if len(shapes) == 1 else str(shapes)
