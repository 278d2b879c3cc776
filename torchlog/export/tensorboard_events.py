"""Writing a history into a TensorBoard event file: its graph, op statistics and activations."""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchlog.datasets.tensorboard_sink import TensorBoardSink, write_summary
from torchlog.errors import InvalidArgumentTypeError, LogFilePermissionError
from torchlog.export.activations import activation_stats
from torchlog.optional import require
from torchlog.export.tensorboard_graph import graph_def, run_metadata
from torchlog.records import PassRecord

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["to_tensorboard", "write_activations", "summary_sink", "open_writer", "activation_tag",
           "RUN_TAG"]

RUN_TAG = "torchlog step {step}"  # the 'session run' the Graphs tab offers for colouring


def to_tensorboard(history: "ModelHistory", logdir_or_writer: Any, step: int = 0) -> str:
    """Write the logged graph, per-op statistics and activation summaries for TensorBoard.

    The Graphs tab shows the logged ops (not a `jit.trace` of the model), module paths
    as name scopes, shapes on edges, and per-op time and output bytes under the
    session run 'torchlog step {step}'. For every saved activation (outputs excepted:
    they repeat their producer) a histogram `{label}/activations` and scalars
    `{label}/mean` and `{label}/std` are written at `step`, `label` being the pass
    label with `:k` written as `/pass k` (`linear_1_1/pass2/mean`).

    Args:
        history: the history to write.
        logdir_or_writer: a folder (created if missing) for a new event file, or an open
            `SummaryWriter` of `torch.utils.tensorboard` or tensorboardX, left open.
        step: the global step of the summaries (e.g. the batch or epoch).

    Returns:
        The folder the event file is in.

    Raises:
        MissingDependencyError: the tensorboard package is missing
            (`pip install torchlog[tensorboard]`).
        LogFilePermissionError: the folder cannot be created or written.
        InvalidArgumentTypeError: `logdir_or_writer` is neither a path nor a writer, or
            `step` is not an int.

    Example:
        >>> import tempfile, torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.Linear(3, 2), torch.ones(1, 3))
        >>> folder = to_tensorboard(h, tempfile.mkdtemp())
        >>> any(name.startswith('events.out.tfevents') for name in os.listdir(folder))
        True
    """
    if isinstance(step, bool) or not isinstance(step, int):
        raise InvalidArgumentTypeError(f"step must be an int, got {step!r}")
    writer, owned = open_writer(logdir_or_writer)
    try:
        _write_graph(writer, history, step)
        write_activations(history, writer, step)
        writer.flush()
    finally:
        if owned:
            writer.close()
    return _logdir_of(writer)


def open_writer(logdir_or_writer: Any) -> tuple[Any, bool]:
    """A SummaryWriter for a folder, or the writer given; True when the caller must close it.

    Raises:
        MissingDependencyError: a folder was given and the tensorboard package is missing.
        LogFilePermissionError: the folder cannot be created or written.
        InvalidArgumentTypeError: neither a path nor a writer.

    Example:
        >>> import tempfile
        >>> writer, owned = open_writer(tempfile.mkdtemp())
        >>> owned, open_writer(writer)[1]
        (True, False)
        >>> writer.close()
    """
    if isinstance(logdir_or_writer, (str, os.PathLike)):
        folder = Path(logdir_or_writer).expanduser()
        _check_writable(folder)
        module = require("torch.utils.tensorboard", "history.to_tensorboard()")
        return module.SummaryWriter(log_dir=str(folder)), True
    if all(callable(getattr(logdir_or_writer, name, None))
           for name in ("add_histogram", "add_scalar", "_get_file_writer")):
        return logdir_or_writer, False
    raise InvalidArgumentTypeError(
        "logdir_or_writer must be a folder (str or path) or a SummaryWriter of "
        f"torch.utils.tensorboard or tensorboardX, got {logdir_or_writer!r}")


def _check_writable(folder: Path) -> None:
    """The folder, or the nearest existing folder above it, must accept new files."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise LogFilePermissionError(
            f"cannot write TensorBoard events to {str(folder)!r}: {str(existing)!r} is a file, "
            "not a folder; choose another logdir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise LogFilePermissionError(
            f"cannot write TensorBoard events to {str(folder)!r}: folder {str(existing)!r} is "
            "not writable; choose a logdir you can write to")


def _write_graph(writer: Any, history: "ModelHistory", step: int) -> None:
    """Graph and run metadata as two events, as both writers' own add_graph writes them."""
    event_pb2 = _event_protos(writer)
    file_writer = writer._get_file_writer()  # both writers expose their event file this way
    graph = event_pb2.Event(graph_def=graph_def(history).SerializeToString())
    file_writer.add_event(graph, step)
    tagged = event_pb2.TaggedRunMetadata(tag=RUN_TAG.format(step=step),
                                         run_metadata=run_metadata(history).SerializeToString())
    file_writer.add_event(event_pb2.Event(tagged_run_metadata=tagged), step)


def _event_protos(writer: Any) -> Any:
    """The Event class module the writer accepts: tensorboardX checks it is its own."""
    if type(writer).__module__.split(".")[0] == "tensorboardX":
        from tensorboardX.proto import event_pb2  # the writer's own package: installed

        return event_pb2
    return require("tensorboard.compat.proto.event_pb2", "history.to_tensorboard()")


def activation_tag(record: PassRecord) -> str:
    """The tag prefix of a pass's summaries: its label, `:k` written as `/passk`.

    Example:
        >>> import torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.ReLU(), torch.ones(2))
        >>> activation_tag(h['relu_1_1'])
        'relu_1_1'
    """
    return record.label if record.num_passes == 1 else f"{record.layer_label}/pass{record.pass_num}"


def write_activations(history: "ModelHistory", writer: Any, step: int) -> int:
    """Histogram and mean/std scalars of every saved numeric activation; returns how many.

    The figures are `torchlog.statistics`' (the viewer shows the same ones): the population
    std, and the histogram's bins over the finite values (NaN and inf have no bin); they are
    written as a dataset's TensorBoardSink writes them (`write_summary`).

    Example:
        >>> import tempfile, torch, torchlog
        >>> from torch.utils.tensorboard import SummaryWriter
        >>> h = torchlog.log_forward_pass(torch.nn.ReLU(), torch.ones(2))
        >>> with SummaryWriter(tempfile.mkdtemp()) as writer:
        ...     write_activations(h, writer, step=0)
        2
    """
    stats = activation_stats(history)
    return sum(write_summary(writer, activation_tag(history[label]), found, step) for label, found in stats.items())


@contextmanager
def summary_sink(logdir_or_writer: Any) -> Iterator[TensorBoardSink | None]:
    """A TensorBoardSink on `logdir_or_writer` (extract's `tensorboard=`: each batch's values
    of each layer, at step = batch index); None when it is None. A writer made here for a
    folder is closed when the block ends; one given is flushed and left open.

    Raises:
        MissingDependencyError, LogFilePermissionError, InvalidArgumentTypeError: as
            `open_writer`, when the block starts.

    Example:
        >>> import tempfile, torch
        >>> with summary_sink(tempfile.mkdtemp()) as sink:
        ...     sink.add("relu_1_1", 0, torch.ones(2))
    """
    if logdir_or_writer is None:
        yield None
        return
    writer, owned = open_writer(logdir_or_writer)
    try:
        yield TensorBoardSink(writer)
        writer.flush()
    finally:
        if owned:
            writer.close()


def _logdir_of(writer: Any) -> str:
    for name in ("log_dir", "logdir"):
        folder = getattr(writer, name, None)
        if isinstance(folder, str):
            return folder
    return str(writer._get_file_writer().get_logdir())
