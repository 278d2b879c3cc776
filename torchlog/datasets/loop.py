"""The loop over a dataset's batches: capture each batch's sites, hand the values to the sinks, show progress."""
from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from torch import nn

from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError, MissingDependencyError
from torchlog.datasets.data import Data
from torchlog.datasets.driver import Driver
from torchlog.datasets.sinks import as_sinks

__all__ = ["run_dataset"]


def run_dataset(model: nn.Module, data: Any, sites: Any, sinks: Any, *, batch_size: int | None = None,
                stop_after: Any = None, progress: bool | None = None) -> Any:
    """Run `model` over `data`, one call per batch, and give each batch's values of `sites`
    to `sinks`.

    Module addresses are captured with forward hooks; other sites are found on a logged
    pass of the first batch that saves nothing, then copied by call position under the lean
    capture (docs/datasets.md). The model runs under `torch.no_grad()` and is left as it was
    (buffers and train/eval flags put back after each batch).

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
        InvalidArgumentTypeError: data, sites or sinks of a wrong type (before the model runs).
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
    driver = Driver(model, sites, stop_after)
    count = 0
    for index, batch in enumerate(_with_progress(batches, batches.num_batches, progress)):
        for site, value in driver.values(batch, index):
            for sink in targets:
                sink.add(site, index, value)
        count += 1
    if count == 0:
        raise InvalidOptionError(f"data {type(data).__name__} gave no batch; pass at least one batch")
    results = [sink.finish() for sink in targets]
    return results if isinstance(sinks, (list, tuple)) else results[0]


def _with_progress(batches: Iterable[Any], total: int | None, progress: bool | None) -> Iterable[Any]:
    """`batches` behind a tqdm bar when asked (or, with None, when tqdm is installed)."""
    if progress is not None and not isinstance(progress, bool):
        raise InvalidArgumentTypeError(f"progress must be True, False or None, got {progress!r}")
    if progress is False:
        return batches
    try:
        bars = importlib.import_module("tqdm.auto")
    except ImportError as exc:
        if progress:
            raise MissingDependencyError(f"progress=True needs tqdm ({exc}); install it with `pip install tqdm` "
                                         "or pass progress=False") from exc
        return batches  # progress=None: a bar only where tqdm is installed
    return bars.tqdm(batches, total=total, unit="batch", desc="batches")
