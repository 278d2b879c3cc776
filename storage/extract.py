"""Running chosen layers over a dataset into one growing array per layer, resumably.

File layout (root attribute `format` = 'torchlog-extract'): `layers/<label>` holds one
dataset per layer with the sample as first axis, grown batch by batch; `batch_sizes`
records how many samples each finished batch added. A batch counts only once every layer
got it, so after an interruption a rerun truncates any half-written batch and continues
after the last finished one.
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import h5py
import numpy as np
import torch
from torch import nn

from torchlog.api import log_forward_pass
from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError, LogFileError, LogFileExistsError
from torchlog.capture.nesting import find_tensors
from torchlog.selection import check_entries
from torchlog.storage import files
from torchlog.storage.arrays import BATCH_SIZES, LAYERS, ActivationFile, Appender
from torchlog.storage.format import COMPLETE, EXTRACT_FORMAT_NAME, FORMAT_VERSION, WRITING
from torchlog.storage.values import WriteOptions

__all__ = ["extract", "open_activations"]


def extract(model: nn.Module, inputs: Any, layers: list[str | int], to: Any,
            batch_size: int | None = None, overwrite: bool = False, progress: bool | None = None,
            compression: str | None = None,
            on_batch: Callable[[Any, int], None] | None = None) -> ActivationFile:
    """Log `layers` of `model` over every batch of `inputs`, appending them to the file `to`.

    Each batch runs through `log_forward_pass(model, batch, layers_to_save=layers)`; each
    selected pass becomes a dataset `layers/<label>` whose first axis is the sample.
    Rerunning after an interruption skips the batches already written.

    Args:
        model: the module to run.
        inputs: with batch_size None, an iterable (or DataLoader) whose items are batches,
            each passed to forward like log_forward_pass's input_args (a list or tuple is
            spread into positional arguments: for a loader of (x, y) pairs, pass
            `(x for x, _ in loader)`); with batch_size, a tensor split along its first
            axis, or an iterable of single samples (tensors, or tuples of tensors)
            stacked into batches.
        layers: entries as for layers_to_save (labels, module addresses, positions).
        to: the HDF5 file to create, or to resume.
        batch_size: samples per batch, see `inputs`.
        overwrite: start over even if `to` exists.
        progress: show a tqdm bar; None shows it only when stderr is a terminal.
        compression: None, 'gzip' or 'lzf'.
        on_batch: called as `on_batch(history, batch_index)` (0-based) once a batch is
            written, e.g. for TensorBoard summaries; not for batches a resumed run skips.

    Returns:
        The file, opened for reading as numpy arrays.

    Raises:
        InvalidArgumentTypeError, InvalidOptionError: bad arguments, before any batch runs.
        LogFileExistsError: `to` exists and is not an unfinished extract of the same layers.
        LogFileError: a layer's output has no batch axis, or changes shape between batches,
            or the inputs of a resumed run do not match the batches already written.

    Example:
        >>> import tempfile, os, torch, torchlog
        >>> path = os.path.join(tempfile.mkdtemp(), "acts.h5")
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
        >>> acts = torchlog.extract(net, torch.rand(10, 3), ["relu_1_2"], path, batch_size=4)
        >>> acts["relu_1_2"].shape
        (10, 4)
    """
    options = WriteOptions(compression)
    entries = _check_layers(layers)
    batches = _batches(inputs, batch_size)
    path = files.as_path(to, "to")
    with _open(path, overwrite, type(model).__name__, entries) as file:
        store = Appender(file, path, options)
        for index, batch in enumerate(_progress(batches, _num_batches(inputs, batch_size), progress)):
            num_samples = _batch_len(batch)
            if store.skip(num_samples):
                continue
            history = log_forward_pass(model, batch, layers_to_save=entries)
            store.append({p.label: p.tensor_contents for p in history if p.saved is not None},
                         num_samples)
            if on_batch is not None:
                on_batch(history, index)
        file.attrs["status"] = COMPLETE
    return ActivationFile(path)


def open_activations(path: Any) -> ActivationFile:
    """Open a file written by `extract` for reading (see ActivationFile)."""
    return ActivationFile(path)


def _check_layers(layers: Any) -> list[str | int]:
    if layers is None or (isinstance(layers, str) and layers == "all"):
        raise InvalidOptionError(f"extract needs a list of layers, got {layers!r}; name the layers to keep")
    return check_entries(layers)


def _batches(inputs: Any, batch_size: int | None) -> Iterator[Any]:
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                   or batch_size < 1):
        raise InvalidOptionError(f"batch_size must be None or a positive int, got {batch_size!r}")
    if isinstance(inputs, torch.Tensor):
        return iter(inputs.split(batch_size) if batch_size else [inputs])
    if not isinstance(inputs, Iterable):
        raise InvalidArgumentTypeError(
            f"inputs must be a tensor, an iterable of batches or a DataLoader, got {inputs!r}")
    return iter(inputs) if batch_size is None else _stacked(iter(inputs), batch_size)


def _stacked(samples: Iterator[Any], batch_size: int) -> Iterator[Any]:
    group: list[Any] = []
    for sample in samples:
        group.append(sample)
        if len(group) == batch_size:
            yield _stack(group)
            group = []
    if group:
        yield _stack(group)


def _stack(samples: list[Any]) -> Any:
    first = samples[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(samples)
    if isinstance(first, (tuple, list)) and all(isinstance(x, torch.Tensor) for x in first):
        return type(first)(torch.stack(column) for column in zip(*samples))
    raise InvalidArgumentTypeError(
        f"with batch_size, inputs must yield tensors or tuples of tensors, got {type(first).__name__}")


def _num_batches(inputs: Any, batch_size: int | None) -> int | None:
    try:
        n = len(inputs)
    except TypeError:
        return None
    return n if batch_size is None else -(-n // batch_size)


def _batch_len(batch: Any) -> int:
    found = find_tensors(batch)
    if not found or found[0][0].dim() == 0:
        raise InvalidArgumentTypeError(
            f"cannot tell the number of samples in batch {batch!r}: it holds no tensor with a "
            "first (sample) axis")
    return found[0][0].shape[0]


def _progress(batches: Iterator[Any], total: int | None, progress: bool | None) -> Iterable[Any]:
    from tqdm.auto import tqdm

    return tqdm(batches, total=total, unit="batch", desc="extract",
                disable=None if progress is None else not progress, file=sys.stderr)


def _open(path: str, overwrite: bool, model_name: str, entries: list) -> h5py.File:
    """Resume the unfinished extract at `path`, or create it.

    Raises:
        LogFileExistsError: `path` exists but is not an extract of this model and layers.
    """
    config = {"model_name": model_name, "layers": json.dumps(entries)}
    if os.path.exists(path) and not overwrite:
        problem = "it is not an HDF5 file"
        if h5py.is_hdf5(path):
            file = files.open_existing(path, "r+")
            problem = _mismatch(file, path, config)
            if problem is None:
                return file
            file.close()
        raise LogFileExistsError(
            f"{path!r} exists and cannot be resumed: {problem}; pass overwrite=True to replace "
            "it, or choose another file")
    files.check_new_path(path, overwrite)
    file = files.create(path, overwrite)
    file.attrs.update({"format": EXTRACT_FORMAT_NAME, "format_version": FORMAT_VERSION,
                       "status": WRITING, **config})
    file.create_group(LAYERS)
    file.create_dataset(BATCH_SIZES, shape=(0,), maxshape=(None,), dtype=np.int64, chunks=(1024,))
    return file


def _mismatch(file: h5py.File, path: str, config: dict[str, str]) -> str | None:
    try:
        files.check_header(file, path, EXTRACT_FORMAT_NAME)
    except LogFileError as exc:
        return str(exc)
    for key, value in config.items():
        found = file.attrs.get(key)
        if found != value:
            return f"it holds an extract with {key} {found!r}, not {value!r}"
    return None
