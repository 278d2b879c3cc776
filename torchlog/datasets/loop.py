"""The loop over a dataset's batches: capture each batch's sites, hand the values to the sinks, show progress."""
from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from torch import nn

from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError, MissingDependencyError
from torchlog.datasets.data import Data
from torchlog.datasets.driver import Driver
from torchlog.datasets.ranks import current_ranks
from torchlog.datasets.sinks import Sink, as_sinks

__all__ = ["run_batches", "run_dataset"]


def run_dataset(model: nn.Module, data: Any, sites: Any, sinks: Any, *, batch_size: int | None = None,
                stop_after: Any = None, progress: bool | None = None) -> Any:
    """Run `model` over `data`, one call per batch, and give each batch's values of `sites`
    to `sinks`.

    Module addresses are captured with forward hooks; other sites are found on a logged
    pass of the first batch that saves nothing, then copied by call position under the lean
    capture (docs/datasets.md). The model runs under `torch.no_grad()` and is left as it was
    (buffers and train/eval flags put back after each batch).

    Under torch.distributed (e.g. `torchrun`), with a process group of several processes,
    every rank passes the whole `data`; rank r of n runs the r-th of n contiguous blocks of
    batches (as `torchlog.extract` does; batch indexes stay global), and its sinks get that
    block only. A sink with `merge_ranks()` (statistics' sink) merges every rank's state
    before `finish()`, identically on every rank; the data's length must be known then.

    Args:
        model: the module to run.
        data: a tensor (split with `batch_size`, else one batch), a list or other iterable
            of batches, or a DataLoader; a batch is a tensor, a tuple/list of forward's
            positional arguments, or a dict of its keyword arguments.
        sites: a site or a list of them: module addresses ('h.0', 'cell:2' for one call,
            whose first returned tensor is taken), layer labels, int positions,
            torchlog.select selectors.
        sinks: a Sink (`add(site, batch_index, value)`, `finish()`), a callable
            `fn(site, batch_index, value)`, or a list of them.
        batch_size: for a tensor, the batch size to split it by.
        stop_after: a site after which each batch's pass ends.
        progress: show a tqdm bar (None: when tqdm is installed).

    Returns:
        What the sink's `finish()` returns (a list, one per sink, when a list was given).

    Raises:
        InvalidArgumentTypeError: data, sites or sinks of a wrong type (before the model runs);
            data of unknown length under several processes.
        InvalidOptionError: data with no batch (before the model runs when its length is
            known); a site that names nothing (after the first batch's probe, with the
            closest names); a batch that does not run a site or runs other ops before it.
        MissingDependencyError: progress=True without tqdm.
        Exception: whatever the model raises, unchanged; no sink is finished then.

    Example:
        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
        >>> shapes = []
        >>> run_dataset(net, torch.randn(10, 3), ["0", "relu_1_2"], lambda site, i, v: shapes.append((site, i, v.shape[0])),
        ...             batch_size=4, progress=False)
        >>> shapes[-2:]
        [('0', 2, 2), ('relu_1_2', 2, 2)]
    """
    batches = Data(data, batch_size)
    targets = as_sinks(sinks)
    results = run_batches(model, batches, sites, targets, stop_after=stop_after, progress=progress)
    return results if isinstance(sinks, (list, tuple)) else results[0]


def run_batches(model: nn.Module, batches: Data, sites: Any, targets: list[Sink], *, stop_after: Any = None,
                progress: bool | None = None, skip: int = 0) -> list[Any]:
    """`run_dataset` over checked batches and sinks, leaving out this rank's first `skip`
    batches (done by an interrupted run); one result per sink.

    Under torch.distributed each rank runs its share of the batches (`Ranks.share`), and a
    sink with a `merge_ranks()` method has it called on every rank before `finish()`. A
    sink with an `end_batch(batch_index)` method has it called after each batch's values.
    """
    ranks = current_ranks()
    share = ranks.share(batches.num_batches)
    todo = range(min(share.start + skip, share.stop), share.stop)
    driver = Driver(model, sites, stop_after)
    total = len(todo) if batches.num_batches is not None else None
    count = 0
    for index, batch in _with_progress(batches.take(todo), total, progress, shown=ranks.rank == 0):
        for site, value in driver.values(batch, index):
            for sink in targets:
                sink.add(site, index, value)
        for sink in targets:
            if hasattr(sink, "end_batch"):
                sink.end_batch(index)
        count += 1
    if count == 0 and skip == 0 and ranks.world_size == 1:
        raise InvalidOptionError(f"data {type(batches.data).__name__} gave no batch; pass at least one batch")
    if ranks.world_size > 1:
        for sink in targets:
            if hasattr(sink, "merge_ranks"):
                sink.merge_ranks()
    return [sink.finish() for sink in targets]


def _with_progress(batches: Iterable[Any], total: int | None, progress: bool | None,
                   shown: bool = True) -> Iterable[Any]:
    """`batches` behind a tqdm bar when asked (or, with None, when tqdm is installed) and
    `shown` (rank 0 of several processes)."""
    if progress is not None and not isinstance(progress, bool):
        raise InvalidArgumentTypeError(f"progress must be True, False or None, got {progress!r}")
    if progress is False or not shown:
        return batches
    try:
        bars = importlib.import_module("tqdm.auto")
    except ImportError as exc:
        if progress:
            raise MissingDependencyError(f"progress=True needs tqdm ({exc}); install it with `pip install tqdm` "
                                         "or pass progress=False") from exc
        return batches  # progress=None: a bar only where tqdm is installed
    return bars.tqdm(batches, total=total, unit="batch", desc="batches")
