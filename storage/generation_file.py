"""One HDF5 file for a whole generation: each step's log appended to it as the step ends.

Layout (docs/generation.md): root attributes `format` ('torchlog-generation'), `format_version`,
`status`, `log_id`, `model_name`, `num_beams` and `num_steps`, the count of steps appended
so far, raised last, so a reader never sees a step half copied; `prompt`; `steps/<k>`, step
k's log laid out as a log file's root is (`metadata`, `activations/`, `by_label/`, ...);
`input_ids/<k>` and `logits/<k>`, what step k read and returned at the last position;
`failed_step`, the partial log of a step whose forward raised; `sequences` once generation
returns. A step streams into a log file of its own in a hidden scratch folder beside the
file while it runs (memory stays bounded by the writer's queue) and is copied in when it
ends, so a process killed mid-step keeps every step before it.
"""
from __future__ import annotations

import datetime
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import h5py
import torch

from torchlog.errors import LogFileError
from torchlog.history import ModelHistory
from torchlog.storage import files
from torchlog.storage.format import (
    ACTIVATIONS,
    COMPLETE,
    FORMAT_VERSION,
    GENERATION_FORMAT_NAME,
    GRADIENTS,
    INCOMPLETE,
    METADATA,
    RNG_STATES,
    WRITING,
    dtype_from_name,
)
from torchlog.storage.lazy import stored_value
from torchlog.storage.metadata import history_from_json
from torchlog.storage.reader import FileHistory
from torchlog.storage.values import WriteOptions, read_value, write_value

__all__ = ["GenerationFile", "StoredGeneration", "StoredStep", "read_generation"]

PROMPT, SEQUENCES, STEPS, FAILED_STEP = "prompt", "sequences", "steps", "failed_step"
INPUT_IDS, LOGITS = "input_ids", "logits"


class GenerationFile:
    """A generation file being written. Creating it checks the path and writes the header
    and the prompt; each `append_step` then adds one finished step.

    Raises (on creation):
        LogFileError: `path` is a folder. LogFileNotFoundError, LogFileExistsError,
            LogFilePermissionError: see files.check_new_path.
    """

    def __init__(self, path: Any, overwrite: bool, model_name: str, prompt: torch.Tensor,
                 num_beams: int = 1) -> None:
        text = files.as_path(path, "save_to")
        if os.path.isdir(text):
            raise LogFileError(
                f"log_generation's save_to={text!r} is a folder; a generation is written to one HDF5 "
                "file: give a file name such as 'generation.h5'")
        self.path = files.check_new_path(text, overwrite)
        self._abspath = os.path.abspath(self.path)
        self.log_id = uuid.uuid4().hex
        with files.create(self.path, overwrite) as file:
            file.attrs.update({"format": GENERATION_FORMAT_NAME, "format_version": FORMAT_VERSION,
                               "status": WRITING, "log_id": self.log_id, "model_name": model_name,
                               "num_beams": num_beams, "num_steps": 0, "created": _now()})
            write_value(file, PROMPT, prompt.detach(), "the prompt", WriteOptions())
            for group in (STEPS, INPUT_IDS, LOGITS):
                file.create_group(group)
        folder, name = os.path.split(self._abspath)
        self._scratch = tempfile.mkdtemp(prefix=f".{name}.", suffix=".steps", dir=folder)

    def step_path(self, step: int) -> str:
        """Where step `step` streams its own log while it runs (a scratch file)."""
        return os.path.join(self._scratch, f"step_{step}.h5")

    def append_step(self, step: int) -> ModelHistory:
        """Copy step `step`'s finished log in as `steps/<step>`, drop its scratch file, and
        return its history, whose values are read from this file.

        Raises:
            LogFileError: the step's log is missing or this file cannot be written.
        """
        name = f"{STEPS}/{step}"
        with files.open_existing(self.path, "r+") as file:
            self._copy_in(step, file, name)
            file.attrs["num_steps"] = step + 1  # the commit point: the step is in
            file.flush()
            return _step_history(file, self.path, self.log_id, name)

    def keep_failed_step(self, step: int) -> ModelHistory | None:
        """Copy the partial log of step `step`, whose forward raised, in as `failed_step`
        and return its history read from this file; None when the step wrote no log."""
        if not os.path.exists(self.step_path(step)):
            return None
        with files.open_existing(self.path, "r+") as file:
            self._copy_in(step, file, FAILED_STEP)
            return _step_history(file, self.path, self.log_id, FAILED_STEP) if METADATA in file[FAILED_STEP] else None

    def add_tokens(self, step: int, input_ids: torch.Tensor | None, logits: torch.Tensor | None) -> None:
        """Write what step `step` read and returned (each skipped when None)."""
        with files.open_existing(self.path, "r+") as file:
            for group, value in ((INPUT_IDS, input_ids), (LOGITS, logits)):
                if value is not None:
                    write_value(file[group], str(step), value.detach(), f"the {group} of step {step}",
                                WriteOptions())
            file.flush()

    def finish(self, sequences: torch.Tensor | None, failure: str | None) -> None:
        """Write the sequences, mark the file 'complete' (or 'incomplete' with `failure`),
        and remove the scratch folder."""
        try:
            with files.open_existing(self.path, "r+") as file:
                if sequences is not None:
                    write_value(file, SEQUENCES, sequences.detach(), "the sequences", WriteOptions())
                file.attrs["status"] = COMPLETE if failure is None else INCOMPLETE
                if failure is not None:
                    file.attrs["failure"] = failure
        finally:
            shutil.rmtree(self._scratch, ignore_errors=True)

    def _copy_in(self, step: int, file: h5py.File, name: str) -> None:
        source = self.step_path(step)
        with files.open_existing(source) as log:
            log.copy(log["/"], file, name=name)  # hard links (by_label/) stay links to one copy
        os.remove(source)


@dataclass(frozen=True, slots=True)
class StoredStep:
    """One step read back from a generation file."""

    history: ModelHistory  # its log; values read from the file on access
    input_ids: torch.Tensor | None  # the token ids it read (None when not recorded)
    logits: torch.Tensor | None  # its logits at the last position


@dataclass(frozen=True, slots=True)
class StoredGeneration:
    """What a generation file holds, as `read_generation` returns it."""

    path: str
    model_name: str
    prompt: torch.Tensor
    num_beams: int
    steps: tuple[StoredStep, ...]  # the steps appended, in order
    sequences: torch.Tensor | None  # None when generation raised (or the writer died)
    failure: str | None  # why the file is not complete; None when it is
    failed_step: ModelHistory | None  # the partial log of the step that raised, if one did


def read_generation(path: Any) -> StoredGeneration:
    """Open a file `log_generation(save_to=...)` wrote: metadata now, activations on access.

    Raises:
        LogFileNotFoundError: no such file.
        LogFileError: not a generation file (a plain log names `torchlog.load`), a newer
            format version, or damaged records.
    """
    path = files.as_path(path)
    with files.open_existing(path) as file:
        status = files.check_header(file, path, GENERATION_FORMAT_NAME)
        try:
            return _read(file, path, status)
        except (KeyError, ValueError, TypeError) as exc:
            raise LogFileError(f"generation file {path!r} is damaged: cannot read its records ({exc!r})") from exc


def _read(file: h5py.File, path: str, status: str) -> StoredGeneration:
    log_id = str(file.attrs["log_id"])
    steps = []
    for k in range(int(file.attrs["num_steps"])):
        history = _step_history(file, path, log_id, f"{STEPS}/{k}")
        steps.append(StoredStep(history, _optional(file, f"{INPUT_IDS}/{k}", path),
                                _optional(file, f"{LOGITS}/{k}", path)))
    failed = _step_history(file, path, log_id, FAILED_STEP) if f"{FAILED_STEP}/{METADATA}" in file else None
    failure = None if status == COMPLETE else str(file.attrs.get(
        "failure", "the writing process stopped before the generation ended"))
    return StoredGeneration(path, str(file.attrs["model_name"]), read_value(file[PROMPT], path),
                            int(file.attrs.get("num_beams", 1)), tuple(steps), _optional(file, SEQUENCES, path),
                            failure, failed)


def _optional(file: h5py.File, name: str, path: str) -> Any:
    return read_value(file[name], path) if name in file else None


def _step_history(file: h5py.File, path: str, log_id: str, name: str) -> ModelHistory:
    """The history of the step log in group `name`, its values read lazily from `path`."""
    group = file[name]
    present = None
    if str(group.attrs.get("status", "")) != COMPLETE:  # a partial step: some values may be missing
        present = {f"{g}/{n}" for g in (ACTIVATIONS, GRADIENTS, RNG_STATES) if g in group for n in group[g]}
    value = _value_reader(group, path, log_id, name, present)
    history = history_from_json(group[METADATA].asstr()[()], value, FileHistory)
    history.path = path
    return history


def _value_reader(group: h5py.Group, path: str, log_id: str, name: str,
                  present: set[str] | None) -> Callable[[str, dict], Any]:
    """`history_from_json`'s reference reader for a step log kept in `group`."""
    abspath = os.path.abspath(path)

    def value(field: str, ref: dict[str, Any]) -> Any:
        if present is not None and ref["ref"] not in present:
            return None
        if field == "rng_state":  # records hold RNG states as plain tensors
            return read_value(group[ref["ref"]], path)
        full = f"{name}/{ref['ref']}"
        if ref["kind"] == "tensor":
            return stored_value(abspath, log_id, full, ref["shape"], dtype_from_name(ref["dtype"]))
        return stored_value(abspath, log_id, full)
    return value


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
