"""Resuming `statistics`: its state saved every few batches to an HDF5 checkpoint, and taken back on a rerun.

The checkpoint holds the sink's whole state exactly (float64 as float64, the quantile
sketch's levels as they are), how many of this rank's batches it covers, and what was asked
(sites, statistics, reduce, CKA pairs, the data's number of batches and batch size, the
number of ranks). A rerun with the same path checks all of that, loads the state and skips
those batches, so its result is the one an uninterrupted run gives, bit for bit. Under
torch.distributed each rank keeps its own file (`<stem>.rank<r><suffix>`). The file is
removed once the run finished. Files go through storage/statistics_file.py, reached lazily
(h5py is an optional extra).
"""
from __future__ import annotations

import os
from typing import Any

from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError
from torchlog.optional import require
from torchlog.datasets.data import Data
from torchlog.datasets.ranks import Ranks

__all__ = ["CheckpointedSink", "checkpoint_path"]


def checkpoint_path(path: Any, ranks: Ranks) -> str:
    """This rank's checkpoint file: `path` itself in one process, else `<stem>.rank<r><suffix>`.

    Raises:
        InvalidArgumentTypeError: a path that is not a str or os.PathLike.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentTypeError(f"checkpoint={path!r} is not a path; pass a str or pathlib.Path to an "
                                       "HDF5 file to create or resume")
    path = os.fspath(path)
    if ranks.world_size == 1:
        return path
    stem, suffix = os.path.splitext(path)
    return f"{stem}.rank{ranks.rank}{suffix}"


class CheckpointedSink:
    """A StatisticsSink whose state is saved to `path` after every `every` batches; `restore`
    loads an earlier run's state from there, and `finish` removes the file.

    Raises:
        InvalidArgumentTypeError: when made, `every` not a positive int.
    """

    def __init__(self, sink: Any, path: str, every: int, batches: Data, ranks: Ranks) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise InvalidArgumentTypeError(f"checkpoint_every must be a positive int (batches), got {every!r}")
        self.sink, self.path, self.every = sink, path, every
        self.store = require("torchlog.storage.statistics_file", "statistics(checkpoint=...)")  # lazily: h5py
        self.run = {"num_batches": batches.num_batches, "batch_size": batches.batch_size,
                    "world_size": ranks.world_size, "rank": ranks.rank}
        self.done = 0  # this rank's batches in the state

    def restore(self) -> int:
        """Load the state an earlier run saved at `path`, if any; return how many of this
        rank's batches it covers (0 without a file).

        Raises:
            InvalidOptionError: a checkpoint of other sites, statistics, reduce, pairs, data
                length, batch size or number of ranks, naming what differs.
            LogFileError: a file at `path` that is not a checkpoint.
        """
        if not os.path.exists(self.path):
            return 0
        meta, tensors = self.store.read_checkpoint(self.path)
        asked = {**self.sink.describe(), **self.run}
        for key, value in asked.items():
            if meta.get(key) != value:
                raise InvalidOptionError(
                    f"checkpoint {self.path!r} is of another run: its {key} is {meta.get(key)!r}, this run's is "
                    f"{value!r}; rerun with the same arguments and data to resume, or delete the file (or "
                    "pass another checkpoint path) to start over")
        self.sink.load_state(meta, tensors)
        self.done = meta["done"]
        return self.done

    def add(self, site: Any, batch_index: int, value: Any) -> None:
        self.sink.add(site, batch_index, value)

    def end_batch(self, batch_index: int) -> None:
        """Every value of the batch is in: save the state after every `every` batches."""
        self.sink.end_batch(batch_index)
        self.done += 1
        if self.done % self.every == 0:
            self.save()

    def save(self) -> None:
        """Write the state now (replacing the file whole)."""
        meta, tensors = self.sink.state()
        self.store.write_checkpoint(self.path, {**meta, **self.run, "done": self.done}, tensors)

    def merge_ranks(self) -> None:
        self.save()  # this rank's share is done: a failed merge reruns none of it
        self.sink.merge_ranks()

    def finish(self) -> Any:
        """The sink's result; the checkpoint, no longer needed, is removed."""
        result = self.sink.finish()
        if os.path.exists(self.path):
            os.remove(self.path)
        return result
