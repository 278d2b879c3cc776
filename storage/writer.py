"""Writing a log file: streamed while the forward pass runs, or from a finished history.

Streaming writes each activation synchronously as capture hands it to the sink (the copy is
freed as soon as it is on disk, so memory stays bounded by one activation), tags it with the
ops seen since the previous one (recovery.py) and flushes, so a process killed at any point
leaves a file that opens. The metadata and the status 'complete' are written only once
the history is finished.
"""
from __future__ import annotations

import datetime
import os
import uuid
import warnings
from collections.abc import Sequence
from typing import Any

import h5py
import torch

from torchlog.capture.captured import ModuleInfo
from torchlog.capture.nodes import RawNode
from torchlog.errors import IncompleteLogWarning, InvalidArgumentTypeError, LogFileError
from torchlog.history import ModelHistory, all_passes
from torchlog.records import LazyTensor, PassRecord
from torchlog.storage import files, heap
from torchlog.storage.format import (
    ACTIVATIONS,
    BY_LABEL,
    COMPLETE,
    FORMAT_NAME,
    FORMAT_VERSION,
    GRADIENTS,
    INCOMPLETE,
    METADATA,
    RNG_STATES,
    WRITING,
    dtype_name,
)
from torchlog.storage.gradients import GradientFile
from torchlog.storage.lazy import StoredTensor, StoredValue, stored_value
from torchlog.storage.metadata import history_to_json
from torchlog.storage.recovery import NodeLog
from torchlog.storage.values import WriteOptions, describe, write_value

__all__ = ["LogWriter", "save_history"]

_GROUP_OF = {"saved": ACTIVATIONS, "grad_saved": GRADIENTS, "rng_state": RNG_STATES}


class LogWriter:
    """One log file being written. Create it before the forward pass: that checks the path.

    Example:
        >>> import tempfile, os, torch, torchlog
        >>> path = os.path.join(tempfile.mkdtemp(), "run.h5")
        >>> h = torchlog.log_forward_pass(torch.nn.Linear(3, 2), torch.ones(1, 3), save_to=path)
        >>> torchlog.load(path)["linear_1_1"].tensor_contents.shape
        torch.Size([1, 2])
    """

    def __init__(self, path: Any, overwrite: bool = False, options: WriteOptions | None = None,
                 streaming: bool = True) -> None:
        """Check the path; the file itself is created when the first value is written.

        Raises:
            LogFileNotFoundError, LogFileExistsError, LogFilePermissionError, LogFileError:
                the path cannot take a new log (see files.check_new_path); nothing is written.
        """
        self.path = files.check_new_path(path, overwrite)
        self._abspath = os.path.abspath(self.path)  # what stored values read: chdir-proof
        self.options = options or WriteOptions()
        self.error: BaseException | None = None  # a value the sink could not store
        self._overwrite = overwrite
        self.log_id = uuid.uuid4().hex  # lets stored values notice their file was replaced
        self._run_attrs: dict[str, Any] = {}
        self._modules: tuple[ModuleInfo, ...] = ()  # written when streaming starts, for recovery
        self._streaming = streaming
        self._file: h5py.File | None = None
        self._node_log: NodeLog | None = None
        self._gradients = GradientFile(self._abspath, self.log_id, self.options)

    def describe_run(self, model_name: str, random_seed: int, modules: Sequence[ModuleInfo] = ()) -> None:
        """Record what a rebuilt (crashed) log needs: the run's name and seed, the module table."""
        self._run_attrs = {"model_name": model_name, "random_seed": random_seed}
        self._modules = tuple(modules)

    def _open(self) -> h5py.File:
        """Create the file (status 'writing') on first use, so failed checks leave nothing."""
        if self._file is None:
            file = files.create(self.path, self._overwrite)
            file.attrs.update({"format": FORMAT_NAME, "format_version": FORMAT_VERSION,
                               "status": WRITING, "created": _now(), "log_id": self.log_id,
                               **self._run_attrs})
            self._activations = file.create_group(ACTIVATIONS)
            self._node_log = NodeLog(file, self._modules) if self._streaming else None
            if self._streaming:
                heap.streaming_started()  # else freed copies would not shrink the heap
            self._file = file
        return self._file

    # ----- streaming ------------------------------------------------------------------------
    def sink(self, nodes: Sequence[RawNode], index: int, value: Any) -> Any:
        """Capture sink (torchlog.capture.ActivationSink): write the activation of `nodes[index]`.

        Returns its lazy stand-in, which the node keeps instead of the value.

        Raises:
            InvalidArgumentTypeError: activation_postfunc returned a value that cannot
                be stored (also kept in `self.error`, as the model run may swallow it).
        """
        name = str(index)
        file = self._open()
        try:
            obj = write_value(self._activations, name, value, f"the activation of op #{index}", self.options)
        except Exception as exc:
            self.error = self.error or exc
            raise
        if self._node_log is not None:
            self._node_log.tag(obj, nodes, index)
        file.flush()  # what is flushed survives the process being killed
        return _lazy(self._abspath, self.log_id, f"{ACTIVATIONS}/{name}", value)

    def gradient_sink(self, index: int, grad: torch.Tensor) -> StoredTensor:
        """GradientStore sink: write the gradient of node `index` as backward produces it.

        Returns its lazy stand-in. Raises what `GradientFile.write` raises (gradients.py).
        """
        return self._gradients.write(index, grad)

    # ----- finishing ------------------------------------------------------------------------
    def finish(self, history: ModelHistory | None, failure: str | None = None) -> None:
        """Write the metadata (and any value not streamed), mark the file, close it.

        The status becomes 'complete', or 'incomplete' when the history is partial or
        missing (then `failure` says why, for readers of the file).

        Raises:
            InvalidArgumentTypeError: a saved value cannot be stored (the same error the
                sink met during the pass, if any); the file is closed as 'incomplete', or
                'writing' when the failing value belongs to the metadata already written.
        """
        if self.error is not None and failure is None:
            failure = f"a value could not be stored: {self.error}"
        file = self._open()
        try:
            if history is not None:
                self._write_history(history)
                failure = failure or (history.info.failure if history.is_partial else None)
            complete = history is not None and failure is None
            file.attrs["status"] = COMPLETE if complete else INCOMPLETE
            if not complete:
                file.attrs["failure"] = failure or "the writer stopped before the pass ended"
        finally:
            file.close()
            if self._streaming:
                heap.streaming_ended()
        if self.error is not None:
            raise self.error

    def abort(self, exc: BaseException) -> None:
        """Close the file after the pass raised `exc`, with the partial history if there is one.

        When nothing reached the file yet (the arguments were refused before the model
        ran) no file is created. Never raises: the caller is propagating `exc`.
        """
        history = getattr(exc, "torchlog_history", None)
        if self._file is None and history is None:
            return
        failure = None if history is not None and history.is_partial else f"{type(exc).__name__}: {exc}"
        try:
            self.error = None if self.error is exc else self.error
            self.finish(history, failure)
        except Exception as err:  # the user's exception matters more; the file still opens
            warnings.warn(f"log file {self.path!r} was left unfinished: {err}",
                          IncompleteLogWarning, stacklevel=2)

    def _write_history(self, history: ModelHistory) -> None:
        pending: dict[int, tuple[str, Any, str]] = {}  # id(value) -> (name, value, description)
        refs: dict[int, dict[str, Any]] = {}

        def ref(field: str, record: PassRecord, value: Any) -> dict[str, Any]:
            known = refs.get(id(value))
            if known is None:
                known = refs[id(value)] = self._reference(field, record, value, pending)
            return known

        file = self._open()
        file.create_dataset(METADATA, data=history_to_json(history, ref), dtype=h5py.string_dtype())
        file.flush()  # metadata before data: a crash now still leaves a readable file
        for name, value, what in pending.values():
            group, _, leaf = name.partition("/")
            write_value(file.require_group(group), leaf, value, what, self.options)
            file.flush()
        self._link_labels(file, history, refs)

    def _reference(self, field: str, record: PassRecord, value: Any,
                   pending: dict[int, tuple[str, Any, str]]) -> dict[str, Any]:
        if isinstance(value, StoredValue) and value.log_id == self.log_id:  # streamed here
            return {"ref": value.name, **_description(value)}
        if isinstance(value, LazyTensor):
            value = value.load()  # from another log file: copy it over
        name = f"{_GROUP_OF[field]}/{record.op_index}"
        pending[id(value)] = (name, value, f"{field} of {record.label}")
        return {"ref": name, **describe(value)}

    @staticmethod
    def _link_labels(file: h5py.File, history: ModelHistory, refs: dict[int, dict[str, Any]]) -> None:
        """Hard links by_label/<label> -> activation, so plain h5py users find layers by name."""
        links = file.create_group(BY_LABEL)
        for record in history:
            found = refs.get(id(record.saved))
            if found is not None and "/" not in record.label and record.label not in (".", ".."):
                links[record.label] = file[found["ref"]]


def save_history(history: ModelHistory, path: Any, overwrite: bool = False,
                 compression: str | None = None, compression_opts: int | None = None) -> str:
    """Write `history` and its saved values to a new log file at `path`; return the path.

    Args:
        history: the history to store (in memory, or loaded from another log file).
        path: the new file, e.g. 'run.h5'.
        overwrite: replace an existing file (never the one the history was loaded from).
        compression: None, 'gzip' or 'lzf' for every dataset.
        compression_opts: gzip level 0..9.

    Raises:
        LogFileNotFoundError, LogFileExistsError, LogFilePermissionError, LogFileError:
            the path cannot take a new log; nothing on disk is touched.
        InvalidArgumentTypeError: a saved value (from activation_postfunc) cannot be
            stored; the file is left with status 'writing'.
    """
    options = WriteOptions(compression, compression_opts)
    if not isinstance(history, ModelHistory):
        raise InvalidArgumentTypeError(f"save_history needs a ModelHistory, got {history!r}")
    _check_source_path(history, path, overwrite)
    writer = LogWriter(path, overwrite, options, streaming=False)
    writer.describe_run(history.model_name, history.random_seed)
    writer.finish(history)
    return writer.path


def _check_source_path(history: ModelHistory, path: Any, overwrite: bool) -> None:
    """Refuse before truncating: overwriting the file a history reads from would lose it."""
    target = files.as_path(path, "save path")
    if not overwrite or not os.path.exists(target):
        return
    for record in all_passes(history):
        if any(isinstance(value, StoredValue) and _same_file(value.path, target)
               for value in (record.saved, record.grad_saved)):
            raise LogFileError(
                f"cannot overwrite {target!r}: this history reads its tensors from it; "
                "save to another path")


def _lazy(path: str, log_id: str, name: str, value: Any) -> StoredValue:
    if isinstance(value, torch.Tensor):
        return stored_value(path, log_id, name, value.shape, value.dtype)
    return stored_value(path, log_id, name)


def _description(value: StoredValue) -> dict[str, Any]:
    if isinstance(value, StoredTensor):
        return {"kind": "tensor", "shape": list(value.shape), "dtype": dtype_name(value.dtype)}
    return {"kind": "value"}


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
