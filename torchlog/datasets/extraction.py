"""`extract`: chosen layers over a dataset into one array per layer, resumably, in one or many processes.

This module runs the batches in a fixed order (batches.py), a rank's share of them, each
captured by the dataset driver (driver.py: the first batch logged once, later batches with
module hooks or the lean capture, seeded, under `no_grad`), and hands each batch's values,
by label, to storage's HDF5 sink (`torchlog.storage.extraction.ExtractSink`, reached lazily:
h5py is an optional extra), which checks, writes, resumes and joins the files.
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from torchlog.datasets.batches import Batches, batch_len
from torchlog.datasets.driver import Driver, DriverOptions
from torchlog.errors import InvalidOptionError, LogFileError
from torchlog.optional import require
from torchlog.seeding import seeded
from torchlog.sites.entries import check_entries, check_stop_after

__all__ = ["extract"]


def extract(model: nn.Module, inputs: Any, layers: list[str | int], to: Any,
            batch_size: int | None = None, overwrite: bool = False, progress: bool | None = None,
            compression: str | None = None, summaries: Any = None,
            chunks: bool | int | None = None, random_seed: int = 0,
            stop_after: Any = None, changed_ops: str = "error") -> Any:
    """Save `layers` of `model` over every batch of `inputs` into one array per layer in `to`.

    The model is called once per batch, by the dataset driver (torchlog.datasets): the first
    batch is logged once, which finds the layers and gives that batch's values; later
    batches run with module hooks (module addresses) and a lean capture (other entries). A
    batch whose ops differ from the first batch's before a chosen op is refused
    (InvalidOptionError), before its values are written; with `changed_ops='by_place'` it is
    saved instead from that same call, each op from its first-batch place (the n-th call of
    its function inside its module), with an OpSequenceChangedWarning. Each batch runs under
    torch.no_grad() with the RNGs seeded to `random_seed` + its index. Rerunning after an
    interruption continues after the last finished batch. Under torch.distributed (e.g.
    torchrun), rank r of n takes the r-th of n blocks of batches, writes
    `<to stem>.shard{r}-of-{n}.h5`, and rank 0 writes `to` joining them; each rank then
    returns the joined file.

    Args:
        model: the module to run.
        inputs: with batch_size None, an iterable (or DataLoader) whose items are batches,
            each passed to forward like log_forward_pass's input_args (a list or tuple is
            spread into positional arguments: for a loader of (x, y) pairs, pass
            `(x for x, _ in loader)`); with batch_size, a tensor split along its first
            axis, a dataset (`len` and `[i]`) or an iterable of single samples (tensors,
            or tuples of tensors) stacked into batches. Many processes need a known length.
        layers: entries as for layers_to_save (labels, module addresses, positions).
        to: the HDF5 file to create, or to resume.
        batch_size: samples per batch, see `inputs`.
        overwrite: start over even if `to` (or its shards) exist.
        progress: show a tqdm bar (global counts, on rank 0 only); None shows it only when
            stderr is a terminal.
        compression: None, 'gzip' or 'lzf' (chunked storage).
        summaries: a sink (`add(site, batch_index, value)`, as run_dataset's) given each
            value once its batch is written, its site the layer's label with `:k` written
            `/passk` (TensorBoard's tags: `TensorBoardSink`); nothing more is logged.
        chunks: None stores each layer contiguously when the number of samples is known
            and nothing is compressed, else in chunks of whole batches; True always
            chunks; an int sets the samples per chunk; False insists on contiguous storage
            (a known number of samples, no compression).
        random_seed: seed of batch 0; batch i runs with random_seed + i.
        stop_after: a site as log_forward_pass takes it ('h.1', 'relu_2_4', a selector):
            each batch ends right after it, so the rest of the model never runs (the
            layers must all run before it). Every batch then runs lean or logged, not with
            module hooks.
        changed_ops: 'error' refuses a batch that runs other ops than the first batch before
            a chosen op (its call numbers would name other ops); 'by_place' saves it from its
            first-batch places, with a warning. A module address is found by its hooks
            whatever runs around it; its number of calls must match the first batch's.

    Returns:
        The file (a torchlog.storage ActivationFile), opened for reading as numpy arrays.

    Raises:
        MissingDependencyError: h5py is not installed.
        InvalidArgumentTypeError, InvalidOptionError: bad arguments, an entry that selects
            nothing, or samples of different shapes, before any file is written; a batch
            that runs other ops than the first before a chosen layer (changed_ops='error'),
            or does not run one, before that batch is written.
        LogFileExistsError: `to` (or a shard) exists and is not an unfinished extract of this
            same run (model, layers, batch size, number of processes).
        LogFileError: a layer's output has no batch axis or changes shape between batches,
            or a resumed run's inputs do not match the batches already written.
        DistributedExtractError: another rank could not start, or rank 0 could not join.

    Example:
        >>> import tempfile, os, torch
        >>> path = os.path.join(tempfile.mkdtemp(), "acts.h5")
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
        >>> acts = extract(net, torch.rand(10, 3), ["relu_1_2"], path, batch_size=4)
        >>> acts["relu_1_2"].shape
        (10, 4)
    """
    hdf5 = require("torchlog.storage.extraction", "extract")  # lazily: h5py is an optional extra
    options = hdf5.WriteOptions(compression)
    check_stop_after(stop_after)
    batches = Batches(inputs, batch_size)
    hdf5.check_chunks(chunks, compression, batches.num_samples is not None and batches.is_indexable,
                      type(batches.inputs).__name__)
    entries = _check_layers(layers)
    sink = hdf5.ExtractSink(to, type(model).__name__, entries, batches.batch_size, batches.num_samples,
                            options, chunks, stop_after)
    driver = Driver(model, entries, stop_after, DriverOptions(
        every_output=True, seed=random_seed, changed_ops=changed_ops))
    job = _Job(driver, batches, sink, summaries)
    with _rng_states_kept(batches, random_seed):
        problem, state = None, None
        try:
            state = job.start(overwrite)
        except Exception as exc:  # every rank learns it before any rank writes
            problem = exc
        sink.agree(problem, overwrite)
        done, stream, first = state
        with _ProgressBar(sink, batches, progress) as bar:
            with sink.writing(bool(done), batches.num_samples_in(job.share), job.selected()):
                job.count(bar, len(done))
                for index, batch, saved in _chain(first, stream, job):
                    job.write(index, batch, saved)
                    job.count(bar, 1)
            return sink.finish(lambda: job.count(bar, 0))  # rank 0 shows the final global count


def _rng_states_kept(batches: Batches, seed: int) -> Any:
    """Around the whole run when no user code runs between batches (a tensor split into
    batches): the RNG states are then saved and put back once, and each batch
    only seeds them. Else each batch saves and restores them itself, so the data's own
    draws (random augmentation) come from the user's streams as without extract. Saving
    and restoring costs about 0.2 ms a batch, mostly numpy's state."""
    if isinstance(batches.inputs, torch.Tensor):
        return seeded(seed)
    return contextlib.nullcontext()


class _Job:
    """One process's part of an extract: its batches, the driver that runs them, and the sink."""

    def __init__(self, driver: Driver, batches: Batches, sink: Any, summaries: Any) -> None:
        self.driver = driver
        self.batches = batches
        self.sink = sink
        self.share = batches.share(sink.group.rank, sink.group.world_size)
        self.summaries = summaries

    def start(self, overwrite: bool) -> tuple[list[int], Iterator, tuple | None]:
        """Check the files and run the first batch still to do, writing nothing.

        Returns:
            The sizes of the batches finished earlier, the stream of the batches after the
            first one to do, and that first one as (index, batch, values by label).
        """
        done = self.sink.check(overwrite)
        stream = self.batches.load(self.share, skip=len(done))
        for index, batch in stream:
            position = index - self.share.start
            if position < len(done):
                self._check_done(index, batch, done[position])
                continue
            return done, stream, (index, batch, self.save(index, batch))
        return done, stream, None

    def _check_done(self, index: int, batch: Any, expected: int) -> None:
        size = self.batches.size(index) if batch is None else batch_len(batch)
        if size != expected:
            raise LogFileError(
                f"cannot resume {self.sink.path!r}: batch {index} has {size} samples but the "
                f"interrupted run wrote {expected}; the inputs differ (pass overwrite=True to "
                "start over)")

    def save(self, index: int, batch: Any) -> dict:
        """The batch's values by label."""
        return self.driver.by_label(batch, index)

    def selected(self) -> list[tuple[Any, list[str]]]:
        """Which entry chose which labels on the first batch (none when no batch ran)."""
        selection = self.driver.selection
        if selection is None:
            return []
        return [(site, [c.label for c in chosen]) for site, chosen in selection.per_site.items()]

    def write(self, index: int, batch: Any, values: dict) -> None:
        for label, value in values.items():
            self.sink.add(label, index, value)
        self.sink.end_batch(index, batch_len(batch))
        if self.summaries is not None:
            for label, value in values.items():
                self.summaries.add(label.replace(":", "/pass"), index, value)

    def count(self, bar: Any, num_batches: int) -> None:
        total = self.sink.count(num_batches)
        if bar is not None:
            bar.update(total - bar.n)
            rate = self.sink.write_rate
            if rate is not None:
                bar.set_postfix_str(f"write {rate:.0f} MB/s", refresh=False)


def _chain(first: tuple | None, stream: Iterator, job: _Job) -> Iterator[tuple[int, Any, tuple]]:
    """The first batch (already run), then the others, each run as it comes."""
    if first is None:
        return
    yield first
    for index, batch in stream:
        yield index, batch, job.save(index, batch)


def _check_layers(layers: Any) -> list[str | int]:
    if layers is None or (isinstance(layers, str) and layers == "all"):
        raise InvalidOptionError(f"extract needs a list of layers, got {layers!r}; name the layers to keep")
    return check_entries(layers)


class _ProgressBar:
    """A tqdm bar of global batch counts on rank 0 (None elsewhere, or when not shown)."""

    def __init__(self, sink: Any, batches: Batches, progress: bool | None) -> None:
        self.bar = None
        if sink.group.rank == 0 and progress is not False:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=batches.num_batches, unit="batch", desc="extract",
                            disable=None if progress is None else False, file=sys.stderr)

    def __enter__(self) -> Any:
        return self.bar

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.close()
