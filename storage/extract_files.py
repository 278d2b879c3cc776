"""One extract file (the target of a single process, or a rank's shard): checking it, creating or resuming it.

Checking reads only, so every rank of a distributed run can refuse to start before any
file is touched; opening then creates the file, or resumes it after its last finished batch.
A file records the run that made it (model, layers, batch size, world size, rank) in root
attributes, and a rerun that differs in any of them is refused.
"""
from __future__ import annotations

import json
import os
from typing import Any

import h5py
import numpy as np

from torchlog.errors import LogFileError, LogFileExistsError
from torchlog.storage import files
from torchlog.storage.arrays import BATCH_SIZES, LAYERS, SELECTED
from torchlog.storage.format import EXTRACT_FORMAT_NAME, FORMAT_VERSION, WRITING

__all__ = ["run_config", "finished_batches", "open_extract", "note_selection", "entry_text"]


def entry_text(entry: Any) -> str | int:
    """A `layers` entry as the file keeps it: a label, address or position as it is, a
    torchlog.select selector as its text (`func('relu') & in_module('features')`): data, not code."""
    return entry if isinstance(entry, (str, int)) else repr(entry)

# What a rerun must share with the run that wrote a file, as messages name it.
_KEYS = {"model_name": "the model", "layers": "layers", "batch_size": "batch_size",
         "num_samples": "the number of samples",
         "world_size": "the world size (the total number of processes)", "rank": "the rank",
         "stop_after": "stop_after"}


def run_config(model_name: str, entries: list, batch_size: int | None, num_samples: int | None,
               world_size: int, rank: int | None, stop_after: Any = None) -> dict[str, str]:
    """The root attributes that identify a run (all str: h5py reads them back equal)."""
    config = {"model_name": model_name, "layers": json.dumps([entry_text(e) for e in entries]),
              "batch_size": json.dumps(batch_size), "num_samples": json.dumps(num_samples),
              "world_size": str(world_size)}
    if rank is not None:
        config["rank"] = str(rank)
    config["stop_after"] = json.dumps(None if stop_after is None else entry_text(stop_after))
    return config


def finished_batches(path: str, config: dict[str, str], overwrite: bool) -> list[int]:
    """The sizes of the batches an earlier run finished in `path` ([] for a new file, or
    with overwrite), reading only.

    Raises:
        LogFileExistsError: `path` exists but is not an extract of this same run (another
            kind of file, model, layer list, batch size or world size).
        LogFileError: `path` cannot be written (see files.check_new_path).
    """
    if overwrite or not os.path.exists(path):
        files.check_new_path(path, overwrite)
        return []
    problem = "it is not an HDF5 file"
    if h5py.is_hdf5(path):
        with files.open_existing(path) as file:
            problem = _mismatch(file, path, config)
            if problem is None:
                return [int(n) for n in file[BATCH_SIZES][()]]
    raise LogFileExistsError(
        f"{path!r} exists and cannot be resumed: {problem}; pass overwrite=True (--overwrite) "
        "to replace it, or choose another file")


def open_extract(path: str, config: dict[str, str], resume: bool) -> h5py.File:
    """Open `path` to append to it (`resume`), or create it anew with `config`.

    Raises:
        LogFileError: HDF5 cannot open or create the file.
    """
    if resume:
        return files.open_existing(path, "r+")
    file = files.create(path, overwrite=True)
    file.attrs.update({"format": EXTRACT_FORMAT_NAME, "format_version": FORMAT_VERSION,
                       "status": WRITING, **config})
    file.create_group(LAYERS)
    file.create_dataset(BATCH_SIZES, shape=(0,), maxshape=(None,), dtype=np.int64, chunks=(1024,))
    return file


def note_selection(file: h5py.File, selected: list[tuple[str | int, list[str]]]) -> None:
    """Record which `layers` entry selected which labels (JSON, read by ActivationFile), so
    that readers take the keys extract took; a resumed file keeps what its first run wrote."""
    if selected and SELECTED not in file[LAYERS].attrs:
        # A selector is kept as its text (`func('relu') & in_module('features')`): data, not code.
        file[LAYERS].attrs[SELECTED] = json.dumps([[entry_text(entry), labels] for entry, labels in selected])


def _mismatch(file: h5py.File, path: str, config: dict[str, Any]) -> str | None:
    try:
        files.check_header(file, path, EXTRACT_FORMAT_NAME)
    except LogFileError as exc:
        return str(exc)
    for key, value in config.items():
        found = file.attrs.get(key)
        if key not in ("model_name", "layers") and found is None:
            continue  # written before these were recorded
        if key in ("batch_size", "num_samples") and "null" in (found, value):
            continue  # one run fed batches of its own: the sizes of the batches are checked
        if found != value:
            return f"it holds an extract with {_KEYS[key]} {found!r}, not {value!r}"
    return None
