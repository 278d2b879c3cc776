"""Writing a log file: streamed while the forward pass runs, or from a finished history.

Streaming takes each activation as capture hands it to the sink (the op's own tensor, not a
copy) and queues it for a background thread (background.py), which writes it, tags it with
the ops seen since the previous one (recovery.py) and flushes, so a process killed at any
point leaves a file that opens. The forward pass goes on meanwhile and waits only when the
queue holds `max_queued_bytes`: memory stays bounded by the queue. The metadata and the
status 'complete' are written only once the history is finished.
"""
from __future__ import annotations

import datetime
import os
import uuid
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

import h5py
import torch

from torchlog.capture import ModuleInfo, RawNode
from torchlog.errors import IncompleteLogWarning, InvalidArgumentTypeError, LogFileError
from torchlog.history import ModelHistory, all_passes
from torchlog.records import LazyTensor, PassRecord
from torchlog.storage import background, files, heap
from torchlog.storage.background import WriteQueue
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
    check_dense,
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
                 streaming: bool = True, max_queued_bytes: int | None = None) -> None:
        """Check the path; the file itself is created when the first value is written.

        `max_queued_bytes` bounds the activations waiting for the writer thread (None:
        background.DEFAULT_MAX_BYTES as it is now); 0 writes each one in the sink, before
        capture goes on, so a process killed at any moment loses no finished op.

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
        self._stream: _Stream | None = None
        self._gradients = GradientFile(self._abspath, self.log_id, self.options)
        self._max_queued_bytes = (background.DEFAULT_MAX_BYTES if max_queued_bytes is None
                                  else max_queued_bytes)
        self._queue: WriteQueue | None = None
        self._stop_queue: weakref.finalize | None = None  # also when dropped unfinished
        self._nodes: Sequence[RawNode] | None = None  # capture's node list of the pass streaming
        # Nodes whose values a write nothing announced changed before they were written in
        # an earlier run of the pass: copied when handed over (all of them after two runs).
        self._copy_indices: set[int] = set()
        self._copy_all = False
        self._num_stale_runs = 0
        self._thread_error_taken = False

    def describe_run(self, model_name: str, random_seed: int, modules: Sequence[ModuleInfo] = ()) -> None:
        """Record what a rebuilt (crashed) log needs: the run's name and seed, the module table."""
        self._run_attrs = {"model_name": model_name, "random_seed": random_seed}
        self._modules = tuple(modules)

    def _open(self) -> h5py.File:
        """Create the file (status 'writing') on first use, so failed checks leave nothing."""
        if self._file is None:
            self._create(self._overwrite)
            if self._streaming:
                heap.streaming_started()  # else freed copies would not shrink the heap
        return self._file

    def _create(self, overwrite: bool) -> None:
        file = files.create(self.path, overwrite)
        file.attrs.update({"format": FORMAT_NAME, "format_version": FORMAT_VERSION,
                           "status": WRITING, "created": _now(), "log_id": self.log_id,
                           **self._run_attrs})
        node_log = NodeLog(file, self._modules) if self._streaming else None
        self._stream = _Stream(file, file.create_group(ACTIVATIONS), node_log, self.options)
        self._file = file

    # ----- streaming ------------------------------------------------------------------------
    def sink(self, nodes: Sequence[RawNode], index: int, value: Any) -> Any:
        """Capture sink (torchlog.capture.ActivationSink): queue the activation of `nodes[index]`.

        A tensor is written later by the writer thread, so it must not change before
        `settle(index)` returns (capture calls it before writing into its memory);
        other values (from activation_postfunc) are written now. A new node list
        means the pass runs again: the file starts over.

        Returns its lazy stand-in, which the node keeps instead of the value.

        Raises:
            InvalidArgumentTypeError: activation_postfunc returned a value that cannot
                be stored (also kept in `self.error`, as the model run may swallow it).
            OSError: what writing an earlier value raised in the writer thread (or any
                other exception it raised).
        """
        if nodes is not self._nodes:
            self._start_pass(nodes)
        what = f"the activation of op #{index}"
        try:
            self._raise_thread_error()
            if self._queue is None:  # max_queued_bytes=0: written now
                self._stream.write(nodes, index, value, what)
            elif isinstance(value, torch.Tensor):
                check_dense(value, what)
                copy = self._copy_all or index in self._copy_indices
                self._queue.put(nodes, index, value, copy)
                self._raise_thread_error()
            else:  # rare: written here, in order, so its errors stop the pass at its op
                self._queue.settle(None)
                self._raise_thread_error()
                self._stream.write(nodes, index, value, what)
        except Exception as exc:
            self.error = self.error or exc
            raise
        return _lazy(self._abspath, self.log_id, f"{ACTIVATIONS}/{index}", value)

    def settle(self, index: int | None) -> None:
        """Capture's `sink_settle`: return once the value of node `index` is written or
        copied (None: once every queued value is written). Never raises: an error of
        the writer thread is raised by the next `sink` call or by `finish`."""
        if self._queue is not None:
            self._queue.settle(index)

    def stale(self) -> list[int]:
        """Capture's `sink_stale`, after `settle(None)`: the nodes of this run whose values
        changed before they were written. The next run copies them when handed over."""
        if self._queue is None:
            return []
        stale = self._queue.stale()
        if stale:
            self._num_stale_runs += 1
            self._copy_indices.update(stale)
            self._copy_all = self._num_stale_runs > 1
        return stale

    def _start_pass(self, nodes: Sequence[RawNode]) -> None:
        """Start writing the pass whose node list is `nodes`; one written before is
        dropped (its file is created again), as this run replaces it."""
        if self._nodes is not None:
            self._stop_thread()
            self._file.close()
            self._create(overwrite=True)  # our own file, from the run before
        else:
            self._open()
        self._nodes = nodes
        if self._max_queued_bytes > 0:
            self._queue = WriteQueue(self._stream.write_activation, self._max_queued_bytes)
            self._thread_error_taken = False
            self._stop_queue = weakref.finalize(self, self._queue.close)

    def _stop_thread(self) -> None:
        """Write what is queued and join the writer thread."""
        if self._stop_queue is not None:
            self._stop_queue()  # calls close() once, and no more when self is collected
            self._stop_queue = None

    def _raise_thread_error(self) -> None:
        """Raise what writing a value raised in the thread, the first time it is seen."""
        error = self._take_thread_error()
        if error is not None:
            raise error

    def _take_thread_error(self) -> BaseException | None:
        """Make what writing a value raised in the thread this writer's error; returns it
        the first time."""
        queue = self._queue
        if queue is None or queue.error is None or self._thread_error_taken:
            return None
        self._thread_error_taken = True
        self.error = self.error or queue.error
        return queue.error


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
        self._stop_thread()
        self._take_thread_error()
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
        try:
            self._stop_thread()
            self._take_thread_error()
            if self.error is exc:  # the pass stopped because the writer thread could not store a value
                failure = f"a value could not be stored: {exc}"
                self.error = None
            else:  # the model's own error: the partial history says where it happened
                failure = None if history is not None and history.is_partial else f"{type(exc).__name__}: {exc}"
            self.finish(history, failure)
        except Exception as err:  # the user's exception matters more; the file still opens
            warnings.warn(f"log file {self.path!r} was left unfinished: {err}",
                          IncompleteLogWarning, stacklevel=2)

    def _write_history(self, history: ModelHistory) -> None:
        pending: dict[int, tuple[str, Any, str]] = {}  # id(value) -> (name, value, description)
        refs: dict[int, dict[str, Any]] = {}

        def ref(field: str, record: PassRecord, value: Any) -> dict[str, Any] | None:
            if id(value) not in refs:
                refs[id(value)] = self._reference(field, record, value, pending)
            return refs[id(value)]

        file = self._open()
        file.create_dataset(METADATA, data=history_to_json(history, ref), dtype=h5py.string_dtype())
        file.flush()  # metadata before data: a crash now still leaves a readable file
        for name, value, what in pending.values():
            group, _, leaf = name.partition("/")
            write_value(file.require_group(group), leaf, value, what, self.options)
            file.flush()
        self._link_labels(file, history, refs)

    def _reference(self, field: str, record: PassRecord, value: Any,
                   pending: dict[int, tuple[str, Any, str]]) -> dict[str, Any] | None:
        if isinstance(value, StoredValue) and value.log_id == self.log_id:  # streamed here
            if value.name not in self._file:  # dropped after the writer thread failed
                return None
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


class _Stream:
    """The open file as the writer thread uses it: one activation at a time, in op order."""

    def __init__(self, file: h5py.File, activations: h5py.Group, node_log: NodeLog | None,
                 options: WriteOptions) -> None:
        self.file = file
        self.activations = activations
        self.node_log = node_log
        self.options = options

    def write(self, nodes: Sequence[RawNode], index: int, value: Any, what: str) -> None:
        """Write and tag the activation of node `index`, then flush: what is flushed
        survives the process being killed. Raises what write_value raises."""
        if str(index) in self.activations:  # an intervention replaced the value of a node already written
            del self.activations[str(index)]
        obj = write_value(self.activations, str(index), value, what, self.options)
        if self.node_log is not None:
            self.node_log.tag(obj, nodes, index)
        self.file.flush()

    def write_activation(self, nodes: Sequence[RawNode], index: int, value: Any) -> None:
        self.write(nodes, index, value, f"the activation of op #{index}")


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
