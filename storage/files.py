"""Checking log file paths and opening HDF5 files, turning every failure into a clear error."""
from __future__ import annotations

import os
import stat
import threading
from typing import Any

import h5py
import numpy as np

from torchlog.errors import (
    InvalidArgumentTypeError,
    LogFileError,
    LogFileExistsError,
    LogFileNotFoundError,
    LogFilePermissionError,
)
from torchlog.storage.format import (
    EXTRACT_FORMAT_NAME,
    FORMAT_NAME,
    FORMAT_VERSION,
    GENERATION_FORMAT_NAME,
    STATISTICS_FORMAT_NAME,
)

__all__ = ["HANDLE_LOCK", "as_path", "check_new_path", "create", "open_existing", "check_header"]

_OPENERS = {FORMAT_NAME: "torchlog.load(path)", EXTRACT_FORMAT_NAME: "torchlog.storage.open_activations(path)",
            STATISTICS_FORMAT_NAME: "torchlog.datasets.Statistics.load(path)",
            GENERATION_FORMAT_NAME: "torchlog.load_generation(path)"}
# HDF5 lets a process open a file read-only while it holds it open for writing (the two
# share one handle), but refuses to open it for writing while a read-only handle is open.
# Stored values hold this lock from opening to closing the file, and so does the gradient
# writer, so a read in one thread never makes a write in another fail.
HANDLE_LOCK = threading.RLock()


def as_path(path: Any, what: str = "path") -> str:
    """`path` as a str, with `~` expanded.

    Raises:
        InvalidArgumentTypeError: not a str or os.PathLike.
    """
    if isinstance(path, (str, os.PathLike)):
        text = os.fspath(path)
        if isinstance(text, str) and text:
            return os.path.expanduser(text)
    raise InvalidArgumentTypeError(f"{what} must be a file path (str or os.PathLike), got {path!r}")


def check_new_path(path: Any, overwrite: bool) -> str:
    """Check that a new log can be written at `path`, touching nothing; return it as str.

    Raises:
        LogFileNotFoundError: the folder does not exist.
        LogFileError: the path is a folder.
        LogFileExistsError: the file exists and overwrite is False.
        LogFilePermissionError: the folder (or the file, to overwrite) is not writable.
    """
    path = as_path(path, "save path")
    folder = os.path.dirname(os.path.abspath(path))
    try:
        is_folder = stat.S_ISDIR(os.stat(folder).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        is_folder = False
    except PermissionError:
        raise LogFilePermissionError(
            f"cannot write log {path!r}: folder {folder!r} cannot be reached (permission denied)") from None
    if not is_folder:
        raise LogFileNotFoundError(
            f"cannot write log {path!r}: folder {folder!r} does not exist; create it first")
    if os.path.isdir(path):
        raise LogFileError(f"cannot write log {path!r}: it is a folder; give a file name such as 'run.h5'")
    if os.path.lexists(path) and not overwrite:
        raise LogFileExistsError(
            f"log file {path!r} already exists; pass overwrite=True to replace it, or choose another name")
    target = path if os.path.exists(path) else folder
    if not os.access(target, os.W_OK):
        raise LogFilePermissionError(
            f"cannot write log {path!r}: {'file' if target == path else 'folder'} {target!r} is not writable")
    return path


def create(path: str, overwrite: bool, **kwargs: Any) -> h5py.File:
    """Create the HDF5 file after `check_new_path`; never replaces a file unless overwrite.

    Raises:
        LogFileExistsError: the file appeared in the meantime and overwrite is False.
        LogFileError: HDF5 cannot create it (the file is open elsewhere, disk full...).
    """
    try:
        return h5py.File(path, "w" if overwrite else "w-", **kwargs)
    except FileExistsError as exc:
        raise LogFileExistsError(
            f"log file {path!r} already exists; pass overwrite=True to replace it") from exc
    except OSError as exc:
        raise LogFileError(f"cannot create log file {path!r}: {_reason(exc)}") from exc


def open_existing(path: Any, mode: str = "r") -> h5py.File:
    """Open an existing HDF5 file.

    Raises:
        LogFileNotFoundError: there is no such file.
        LogFilePermissionError: it cannot be read (or written, with mode 'r+').
        LogFileError: it is a folder, not an HDF5 file, truncated, or locked by a writer.
    """
    path = as_path(path)
    if not os.path.exists(path):
        raise LogFileNotFoundError(f"log file {path!r} does not exist")
    if os.path.isdir(path):
        raise LogFileError(f"{path!r} is a folder, not a log file")
    try:
        return h5py.File(path, mode)
    except PermissionError as exc:
        raise LogFilePermissionError(f"cannot open log file {path!r}: permission denied") from exc
    except OSError as exc:
        raise LogFileError(f"cannot open log file {path!r}: {_reason(exc)}") from exc


def _reason(exc: OSError) -> str:
    text = str(exc)
    if "signature not found" in text:
        return "it is not an HDF5 file (corrupt, or another format)"
    if "truncated file" in text:
        return f"the file is truncated (cut short after it was written): {text}"
    if "lock" in text:
        return ("the file is locked: another process is writing it, or it is open for writing "
                "in this process; wait for the writer to finish")
    if "already open for read-only" in text:
        return ("the file is open read-only in this process (an h5py.File on it); close "
                "that handle to let torchlog write to it")
    if "already open" in text:
        return "the file is already open for writing in this process"
    return text


def check_header(file: h5py.File, path: str, expected: str) -> str:
    """Check the root attributes of a torchlog file and return its status.

    Raises:
        LogFileError: not a torchlog file of the expected kind, or written by a newer
            format version than this torchlog reads.
    """
    found = file.attrs.get("format")
    found = found.decode() if isinstance(found, bytes) else found
    if found != expected:
        if found in _OPENERS:
            raise LogFileError(
                f"{path!r} is a {found!r} file, not a {expected!r} file; open it with {_OPENERS[found]}")
        raise LogFileError(
            f"{path!r} is an HDF5 file but not a torchlog log (root attribute 'format' is "
            f"{found!r}, expected {expected!r})")
    version = file.attrs.get("format_version")
    if isinstance(version, (bool, np.bool_)) or not isinstance(version, (int, np.integer)):
        raise LogFileError(f"{path!r} has no valid 'format_version' attribute (got {version!r})")
    if int(version) > FORMAT_VERSION:
        raise LogFileError(
            f"{path!r} was written in torchlog file format version {int(version)}, but this "
            f"torchlog reads versions up to {FORMAT_VERSION}; upgrade torchlog to open it")
    return str(file.attrs.get("status", ""))
