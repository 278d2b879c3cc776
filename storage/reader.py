"""Opening a log file as a ModelHistory whose tensors stay on disk until accessed."""
from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import h5py

from torchlog.errors import IncompleteLogWarning, LayerNotFoundError, LogFileError
from torchlog.history import ModelHistory, all_passes
from torchlog.records import LayerRecord, PassRecord
from torchlog.storage import files
from torchlog.storage.format import (
    ACTIVATIONS,
    COMPLETE,
    FORMAT_NAME,
    GRADIENTS,
    INCOMPLETE,
    METADATA,
    RNG_STATES,
    dtype_from_name,
)
from torchlog.storage.lazy import StoredTensor, StoredValue, dataset_value, stored_value
from torchlog.storage.metadata import history_from_json
from torchlog.storage.recovery import rebuild
from torchlog.storage.values import read_value

__all__ = ["load", "FileHistory"]

# Source folders of torchlog and torchlog.storage: warnings point past their frames.
_OWN_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (sys.modules["torchlog"], files))


def load(path: Any) -> ModelHistory:
    """Open the log at `path`: records are read now, tensors only when accessed.

    Opening costs time and memory in proportion to the number of ops, not to the size
    of the activations. A file whose writer did not finish (the process was killed, or
    the model raised) opens as a partial history (`history.is_partial`) and issues an
    IncompleteLogWarning; every activation written before the stop can be read.

    Args:
        path: a file written by `log_forward_pass(..., save_to=path)` or `history.save(path)`.

    Returns:
        The history; `history[label].tensor_contents` reads that activation from the file.

    Raises:
        LogFileNotFoundError: no such file.
        LogFileError: not an HDF5 file, truncated, not a torchlog log, written by a newer
            format version, or with records that cannot be parsed.

    Example:
        >>> import tempfile, os, torch, torchlog
        >>> path = os.path.join(tempfile.mkdtemp(), "run.h5")
        >>> _ = torchlog.log_forward_pass(torch.nn.ReLU(), -torch.ones(2), save_to=path)
        >>> history = torchlog.load(path)
        >>> history["relu_1_1"].tensor_contents
        tensor([0., 0.])
    """
    path = files.as_path(path)
    with files.open_existing(path) as file:
        status = files.check_header(file, path, FORMAT_NAME)
        try:
            history, note = _read(file, path, status)
        except (KeyError, ValueError, TypeError) as exc:
            raise LogFileError(f"log file {path!r} is damaged: cannot read its records ({exc!r})") from exc
    if note is not None:
        warnings.warn(f"log file {path!r} is incomplete: {note}", IncompleteLogWarning,
                      stacklevel=_user_stacklevel())
    return history


def _user_stacklevel() -> int:
    """The stacklevel of the first caller outside torchlog (torchlog.load wraps this load)."""
    level, frame = 2, sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_OWN_DIRS):
        level, frame = level + 1, frame.f_back
    return level


def _read(file: h5py.File, path: str, status: str) -> tuple[ModelHistory, str | None]:
    failure = str(file.attrs.get("failure", "the writing process stopped before the end"))
    if METADATA not in file:
        history = rebuild(file, path, failure, FileHistory)
        history.path = path
        return history, (f"{failure}; rebuilt {len(history)} ops from the nodes stored with its "
                         f"activations, {history.num_saved} with saved activations")
    present = None if status == COMPLETE else _present_names(file)
    log_id = str(file.attrs.get("log_id", ""))
    def value(field: str, ref: dict[str, Any]) -> Any:
        if present is not None and ref["ref"] not in present:
            return None
        if field == "rng_state":  # records hold RNG states as plain tensors
            return read_value(file[ref["ref"]], path)
        return _lazy(os.path.abspath(path), log_id, ref)

    history = history_from_json(file[METADATA].asstr()[()], value, FileHistory)
    history.path = path
    _find_streamed_gradients(file, history, os.path.abspath(path), log_id)
    if status == COMPLETE:
        return history, None
    if status == INCOMPLETE:
        return history, failure
    history.info.is_partial = True
    return history, "the writer stopped while writing activations; those missing read as None"


def _present_names(file: h5py.File) -> set[str]:
    """Full names of the stored values, for files whose metadata may name missing ones."""
    return {f"{group}/{name}" for group in (ACTIVATIONS, GRADIENTS, RNG_STATES) if group in file
            for name in file[group]}


def _find_streamed_gradients(file: h5py.File, history: ModelHistory, path: str, log_id: str) -> None:
    """Give each pass the gradient a backward wrote after the metadata (gradients.py).

    A dataset without its `torch_dtype` attribute was cut short by a killed process and
    is left out.
    """
    group = file.get(GRADIENTS)
    if not isinstance(group, h5py.Group) or not len(group):
        return
    for record in all_passes(history):
        obj = None if record.grad_saved is not None else group.get(str(record.op_index))
        value = None if obj is None else dataset_value(path, log_id, f"{GRADIENTS}/{record.op_index}", obj)
        if isinstance(value, StoredTensor):
            record.grad_saved = value


def _lazy(path: str, log_id: str, ref: dict[str, Any]) -> StoredValue:
    if ref["kind"] == "tensor":
        return stored_value(path, log_id, ref["ref"], ref["shape"], dtype_from_name(ref["dtype"]))
    return stored_value(path, log_id, ref["ref"])


class FileHistory(ModelHistory):
    """A ModelHistory loaded from a log file: lookups that fail also name the file."""

    path: str  # the log file its tensors are read from

    def __getitem__(self, key: int | str) -> PassRecord | LayerRecord:
        try:
            return super().__getitem__(key)
        except LayerNotFoundError as exc:
            raise LayerNotFoundError(f"{exc} (in log file {self.path!r})") from None
