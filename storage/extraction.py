"""The HDF5 sink of an extract: one array per layer, resumable, in one or many processes.

File layout (root attribute `format` = 'torchlog-extract'): `layers/<label>` holds one
dataset per layer with the sample as first axis, and the group's `selected` attribute
which `layers` entry chose which labels (so readers take the same keys); `batch_sizes`
records how many samples each finished batch added. A batch counts only once every layer got it, so after an
interruption a rerun continues after the last finished one. Under torch.distributed each
rank writes a shard of its own and rank 0 joins them (see shards.py).

The model is run by torchlog.datasets (`torchlog/datasets/extraction.py`, the dataset
driver of `torchlog.extract`); this module only checks, writes and joins the files it is
handed each batch's values for.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from torchlog.errors import InvalidOptionError, LogFileExistsError
from torchlog.storage import files
from torchlog.storage.arrays import ActivationFile, Appender
from torchlog.storage.distributed import current_group
from torchlog.storage.extract_files import finished_batches, note_selection, open_extract, run_config
from torchlog.storage.format import COMPLETE
from torchlog.storage.shards import join_shards, other_runs, remove_other_runs, shard_path
from torchlog.storage.values import WriteOptions

__all__ = ["ExtractSink", "WriteOptions", "check_chunks", "open_activations"]


class ExtractSink:
    """Writes an extract's batches into `to` (or this rank's shard of it), batch after batch.

    The driver calls, in order: `check` (reading only, on every rank), `agree` (every rank
    learns whether all can start), `writing` (the file open, around the batches), `add`
    for each layer of a batch then `end_batch`, and `finish` (rank 0 joins the shards).
    `group` is this process's place among the ranks (torch.distributed, else one process).

    `chunks` is as `check_chunks` accepts it.
    """

    def __init__(self, to: Any, model_name: str, entries: list, batch_size: int | None,
                 num_samples: int | None, options: WriteOptions, chunks: bool | int | None = None,
                 stop_after: Any = None) -> None:
        self.target = files.as_path(to, "to")
        self.group = current_group()
        world, rank = self.group.world_size, self.group.rank
        self.path = self.target if world == 1 else shard_path(self.target, rank, world)
        self.config = run_config(model_name, entries, batch_size, num_samples, world,
                                 None if world == 1 else rank, stop_after)
        self.target_config = run_config(model_name, entries, batch_size, num_samples, world, None, stop_after)
        self.options = options
        self.chunks = chunks
        self._store: Appender | None = None
        self._values: dict[str, torch.Tensor] = {}

    def check(self, overwrite: bool) -> list[int]:
        """The sizes of the batches an earlier run finished ([] to start anew), reading only.

        Raises:
            LogFileExistsError: the file (or a shard next to it) is not an unfinished extract
                of this same run.
        """
        problem = None if overwrite else other_runs(self.target, self.group.world_size)
        if problem is not None:
            raise LogFileExistsError(
                f"{self.target!r} cannot be resumed: {problem}; or pass overwrite=True "
                "(--overwrite) to start over")
        return finished_batches(self.path, self.config, overwrite)

    def agree(self, problem: BaseException | None, overwrite: bool) -> None:
        """Every rank says whether it can start; with `overwrite`, rank 0 then removes the
        files of runs with another number of processes.

        Raises:
            Exception: `problem` itself, on the rank that had it.
            DistributedExtractError: on the other ranks, naming the rank and its message.
        """
        self.group.agree(problem)
        if overwrite and self.group.rank == 0:
            remove_other_runs(self.target, self.group.world_size)

    @contextlib.contextmanager
    def writing(self, resume: bool, num_samples: int | None, selected: list) -> Iterator[ExtractSink]:
        """The file open for the batches: created, or resumed after its finished batches
        (`resume`); `num_samples` this file will hold when known, `selected` which entry
        chose which labels. Marked finished when the block ends without an error."""
        with open_extract(self.path, self.config, resume=resume) as file:
            self._store = Appender(file, self.path, self.options, num_samples, self.chunks)
            note_selection(file, selected)
            yield self
            file.attrs["status"] = COMPLETE

    def add(self, label: str, batch_index: int, value: torch.Tensor) -> None:
        """Take one layer's value of the batch being written."""
        self._values[label] = value

    def end_batch(self, batch_index: int, num_samples: int) -> None:
        """Write the batch whose layers were added, all at once.

        Raises:
            LogFileError: a layer with no batch axis, or whose shape or dtype changed.
        """
        values, self._values = self._values, {}
        self._store.append(values, num_samples, batch_index)

    def count(self, num_batches: int) -> int:
        """Add this rank's finished batches to the global count; the global count."""
        return self.group.count(num_batches)

    @property
    def write_rate(self) -> float | None:
        """MB/s written so far, or None before the first write."""
        store = self._store
        return store.write_bytes / store.write_seconds / 2**20 if store is not None and store.write_seconds else None

    def finish(self, before_join: Callable[[], None] = lambda: None) -> ActivationFile:
        """End together with the other ranks: rank 0, once every shard is finished, calls
        `before_join` and joins them into the target. The target, opened for reading."""
        def join() -> None:
            before_join()
            if self.group.world_size > 1:
                join_shards(self.target, self.group.world_size, self.target_config)

        self.group.finish(join)
        return ActivationFile(self.target)


def open_activations(path: Any) -> ActivationFile:
    """Open a file written by `extract` for reading (see ActivationFile).

    Example:
        >>> import tempfile, os, torch, torchlog
        >>> path = os.path.join(tempfile.mkdtemp(), "acts.h5")
        >>> _ = torchlog.extract(torch.nn.ReLU(), torch.rand(6, 2), ["relu_1_1"], path, batch_size=4)
        >>> open_activations(path).num_samples
        6
    """
    return ActivationFile(path)


def check_chunks(chunks: Any, compression: str | None, contiguous: bool, inputs: str) -> None:
    """Check `chunks`; `contiguous`: whether the number of samples is known without loading
    the data, `inputs` the inputs' type name for the message.

    Raises:
        InvalidOptionError: `chunks` not one of its forms, or False where storage cannot be
            contiguous.
    """
    if chunks is False and (compression is not None or not contiguous):
        raise InvalidOptionError(
            f"chunks=False (contiguous storage) needs a known number of samples (a tensor or a "
            f"dataset, with batch_size) and no compression, got compression={compression!r} and "
            f"{inputs} inputs; leave chunks=None to chunk when needed")
    if chunks is None or isinstance(chunks, bool) or (isinstance(chunks, int) and chunks > 0):
        return
    raise InvalidOptionError(
        f"chunks must be None (contiguous when possible), True (chunks of whole batches), a "
        f"positive number of samples per chunk, or False (contiguous), got {chunks!r}")
