"""Extracted activations as a torch Dataset, read block by block, to train probes or autoencoders on."""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import h5py
import numpy as np
import torch

from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError
from torchlog.storage import files
from torchlog.storage.arrays import LAYERS, ActivationFile
from torchlog.storage.format import CHUNK_BYTES, array_to_tensor

__all__ = ["ActivationDataset"]


class ActivationDataset(torch.utils.data.Dataset):
    """The samples of an extract file: item `i` is row `i` of each chosen layer.

    With one layer an item is a tensor, with several a tuple of tensors in the order
    given, each in the layer's own dtype (bfloat16 included). Layers are named by label or
    by the keys extract took (`layers=['fc1']` after `extract(..., layers=['fc1', 'act'])`).
    Rows are read in blocks of `block_samples` samples and the last block of each layer
    is kept, so reading in order (a DataLoader without shuffle) reads the file once, block
    by block; `__getitems__` lets a DataLoader read a whole batch with one read per block
    it touches. The file is opened on first read in each process, so DataLoader workers
    each open their own.

    Example:
        >>> import tempfile, os, torch, torchlog
        >>> path = os.path.join(tempfile.mkdtemp(), "acts.h5")
        >>> _ = torchlog.extract(torch.nn.ReLU(), torch.arange(6.).view(3, 2), ["relu_1_1"], path, batch_size=2)
        >>> data = ActivationDataset(path, layers=["relu_1_1"])
        >>> len(data), data[2]
        (3, tensor([4., 5.]))
    """

    def __init__(self, path: Any, layers: Sequence[str | int] | None = None,
                 block_samples: int | None = None) -> None:
        """Read the file's layer list; no data yet.

        Args:
            path: a file written by `extract` (a joined file of shards too).
            layers: the layers to read (default: every layer, in execution order): labels,
                or entries of the `layers` given to extract (a module address, a substring,
                a position), each standing for the layers it selected, in execution order.
            block_samples: samples per read (default: about 4 MiB of the widest layer).

        Raises:
            LogFileNotFoundError, LogFileError: as ActivationFile (a missing shard included).
            LayerNotFoundError: a key that is neither a label of the file nor an entry
                extract was given; the message lists both, and the closest.
            InvalidArgumentTypeError, InvalidOptionError: bad `layers` or `block_samples`.
        """
        self.file = ActivationFile(path)
        if isinstance(layers, str) or (layers is not None and not isinstance(layers, (list, tuple))):
            raise InvalidArgumentTypeError(
                f"layers must be a list of layer labels or of the entries extract was given, got "
                f"{layers!r}; e.g. layers=[{layers!r}]")
        # Each key as extract took it (a label, a module address, ...) -> its labels.
        self.layers = list(self.file.layers) if layers is None else [
            label for key in layers for label in self.file.labels_for(key)]
        if block_samples is not None and (isinstance(block_samples, bool) or not isinstance(block_samples, int)
                                          or block_samples < 1):
            raise InvalidOptionError(f"block_samples must be a positive int, got {block_samples!r}")
        widest = max((int(np.prod(self.file.shapes[k][1:], dtype=np.int64)) * _itemsize(self.file.dtypes[k])
                      for k in self.layers), default=1)
        self.block_samples = block_samples or max(1, CHUNK_BYTES // max(1, widest))
        self.num_reads = 0  # HDF5 reads so far in this process
        self._handle: tuple[int, h5py.File] | None = None  # (pid, file) of this process
        self._blocks: dict[str, tuple[int, torch.Tensor]] = {}  # layer -> (first row, rows)

    def __len__(self) -> int:
        return self.file.num_samples

    def __getitem__(self, index: int) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The sample `index` (negative counts from the end).

        Raises:
            IndexError: outside 0..len-1.
        """
        row = self._row(index)
        values = tuple(self._block(label, row)[1][row - self._blocks[label][0]] for label in self.layers)
        return values[0] if len(values) == 1 else values

    def __getitems__(self, indexes: list[int]) -> list:
        """The samples `indexes`, reading each block they touch once (DataLoader's batched fetch)."""
        rows = [self._row(i) for i in indexes]
        order = sorted(range(len(rows)), key=rows.__getitem__)
        items: list = [None] * len(rows)
        for position in order:  # in file order, so each block is read once
            items[position] = self[rows[position]]
        return items

    def _row(self, index: int) -> int:
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise InvalidArgumentTypeError(f"sample index must be an int, got {index!r}")
        row = int(index) + (len(self) if index < 0 else 0)
        if not 0 <= row < len(self):
            raise IndexError(f"sample {index} is outside the {len(self)} samples of {self.file.path!r}")
        return row

    def _block(self, label: str, row: int) -> tuple[int, torch.Tensor]:
        kept = self._blocks.get(label)
        if kept is not None and kept[0] <= row < kept[0] + len(kept[1]):
            return kept
        first = row - row % self.block_samples
        last = min(first + self.block_samples, len(self))
        array = self._open()[LAYERS][label][first:last]
        self.num_reads += 1
        self._blocks[label] = (first, array_to_tensor(array, self.file.dtypes[label]))
        return self._blocks[label]

    def _open(self) -> h5py.File:
        if self._handle is None or self._handle[0] != os.getpid():
            self._handle = (os.getpid(), files.open_existing(self.file.path))  # after a fork: anew
            self._blocks = {}
        return self._handle[1]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_handle"], state["_blocks"] = None, {}  # workers started by spawn open their own
        return state

    def __repr__(self) -> str:
        return (f"<ActivationDataset {self.file.path!r}: {len(self)} samples of "
                f"{', '.join(self.layers)}>")


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
