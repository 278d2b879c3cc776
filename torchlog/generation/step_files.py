"""`save_to=` for a generation: a folder holding one HDF5 log per step, each written as its step runs."""
from __future__ import annotations

import os
from typing import Any

from torchlog.errors import InvalidArgumentTypeError, LogFileExistsError, LogFileNotFoundError

__all__ = ["STEP_FILE", "step_folder", "step_path"]

STEP_FILE = "step_{:04d}.h5"  # step k's log in the folder: step_0000.h5 is the prefill


def step_folder(save_to: Any, overwrite: bool) -> str:
    """Check (and create, if it is missing) the folder the steps' logs go to; return its path.

    Nothing is written but the empty folder: each step's file is created by its own
    `log_forward_pass(save_to=...)` as the step runs, so a generation that raises keeps the
    files of the steps it finished.

    Raises:
        InvalidArgumentTypeError: `save_to` is not a path.
        LogFileNotFoundError: the folder's parent does not exist.
        LogFileExistsError: `save_to` is a file, or a folder already holding step logs and
            `overwrite` is False.
    """
    if not isinstance(save_to, (str, os.PathLike)):
        raise InvalidArgumentTypeError(
            f"log_generation's save_to must be a folder path (str or os.PathLike), got {save_to!r}")
    folder = os.fspath(save_to)
    if os.path.lexists(folder) and not os.path.isdir(folder):
        raise LogFileExistsError(
            f"log_generation's save_to={folder!r} is a file; it takes a folder, where each step is "
            f"written to its own log ({STEP_FILE.format(0)}, {STEP_FILE.format(1)}, ...)")
    if not os.path.isdir(folder):
        parent = os.path.dirname(os.path.abspath(folder))
        if not os.path.isdir(parent):
            raise LogFileNotFoundError(
                f"cannot write the steps' logs to {folder!r}: folder {parent!r} does not exist; create it first")
        os.mkdir(folder)
        return folder
    written = sorted(name for name in os.listdir(folder) if _is_step_file(name))
    if written and not overwrite:
        raise LogFileExistsError(
            f"folder {folder!r} already holds step logs ({', '.join(written[:3])}"
            f"{', ...' if len(written) > 3 else ''}); pass overwrite=True to replace them, or choose another folder")
    for name in written:  # a shorter generation must not leave a longer one's last steps behind
        os.remove(os.path.join(folder, name))
    return folder


def step_path(folder: str, step: int) -> str:
    """The path of step `step`'s log in `folder`."""
    return os.path.join(folder, STEP_FILE.format(step))


def _is_step_file(name: str) -> bool:
    stem, dot, suffix = name.partition(".")
    return suffix == "h5" and stem.startswith("step_") and stem[5:].isdigit()
