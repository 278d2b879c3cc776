"""A sink writing each batch's values of each site to TensorBoard: a histogram and mean/std scalars per batch."""
from __future__ import annotations

import os
from typing import Any

import torch

from torchlog.errors import InvalidArgumentTypeError
from torchlog.optional import require
from torchlog.statistics import TensorStats, summarize

__all__ = ["TensorBoardSink", "write_summary"]


def write_summary(writer: Any, tag: str, stats: TensorStats, step: int) -> bool:
    """Write `{tag}/activations` (a histogram over the finite values) and the `{tag}/mean`
    and `{tag}/std` scalars (population std) of `stats` at `step`; False, writing nothing,
    when the value has no finite entry."""
    if not stats.counts:
        return False
    n, mean, std = stats.num_finite, stats.mean, stats.std
    writer.add_histogram_raw(f"{tag}/activations", min=stats.min, max=stats.max, num=n, sum=mean * n,
                             sum_squares=n * (std * std + mean * mean), bucket_limits=stats.bin_edges()[1:],
                             bucket_counts=list(stats.counts), global_step=step)
    writer.add_scalar(f"{tag}/mean", mean, step)
    writer.add_scalar(f"{tag}/std", std, step)
    return True


class TensorBoardSink:
    """A Sink writing, for every value `run_dataset` hands it, a histogram `{site}/activations`
    and scalars `{site}/mean` and `{site}/std` at step = the batch index. A site that gives
    several values in a batch (a module called twice, a layer in a loop) writes its first
    under `{site}/...` and its k-th (k >= 2) under `{site}/pass{k}/...`. The figures are those `extract(tensorboard=)`
    and `to_tensorboard` write (`torchlog.statistics.summarize`: the population std, the
    histogram over the finite values); a value without a finite entry writes nothing.
    Nothing else is logged: the values are the driver's, from hooks or the lean capture.

    Args:
        logdir_or_writer: a folder for a new event file (the tensorboard package needed),
            or an open SummaryWriter (torch.utils.tensorboard or tensorboardX), left open.

    Raises:
        InvalidArgumentTypeError: neither a folder nor a writer.
        MissingDependencyError: a folder, and tensorboard is not installed.

    Example:
        >>> import tempfile, torch, torchlog
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
        >>> folder = torchlog.datasets.run_dataset(net, torch.randn(10, 3), ["1"], TensorBoardSink(tempfile.mkdtemp()),
        ...                                        batch_size=5, progress=False)
        >>> any(name.startswith("events.out.tfevents") for name in os.listdir(folder))
        True
    """

    def __init__(self, logdir_or_writer: Any) -> None:
        if isinstance(logdir_or_writer, (str, os.PathLike)):
            board = require("torch.utils.tensorboard", "TensorBoardSink")
            self.writer, self.owned = board.SummaryWriter(log_dir=os.fspath(logdir_or_writer)), True
        elif all(callable(getattr(logdir_or_writer, name, None)) for name in ("add_histogram_raw", "add_scalar")):
            self.writer, self.owned = logdir_or_writer, False
        else:
            raise InvalidArgumentTypeError(
                f"TensorBoardSink takes a folder (str or path) or a SummaryWriter of torch.utils.tensorboard or "
                f"tensorboardX, got {logdir_or_writer!r}")
        self._passes: dict[Any, int] = {}  # site -> values seen in the current batch
        self._batch = -1

    def add(self, site: Any, batch_index: int, value: torch.Tensor) -> None:
        """Write one value's histogram and scalars at step `batch_index`."""
        if batch_index != self._batch:
            self._batch, self._passes = batch_index, {}
        self._passes[site] = self._passes.get(site, 0) + 1
        if value.is_complex() or value.numel() == 0:
            return
        tag = str(site) if self._passes[site] == 1 else f"{site}/pass{self._passes[site]}"
        write_summary(self.writer, tag, summarize(value.detach()), batch_index)

    def finish(self) -> str:
        """Flush (and close a writer made here); return the folder of the event file."""
        self.writer.flush()
        folder = self.writer.get_logdir() if hasattr(self.writer, "get_logdir") else self.writer.logdir
        if self.owned:
            self.writer.close()
        return str(folder)
