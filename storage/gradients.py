"""Writing gradients into a finished log file while the user's backward produces them.

`log_forward_pass(..., save_to=path, save_gradients=True)` finishes the file when the
forward pass ends, but gradients only exist later, one tensor hook at a time, during
`backward()`. Each one is written as `gradients/<op_index>` (replacing what an earlier
backward left there) and flushed, and the pass record keeps a StoredTensor instead of the
tensor, so memory stays bounded by one gradient and a process killed mid-backward leaves
the gradients written so far readable. `load` finds them by op index (reader.py), since
the metadata was written before they existed.

The file is opened for writing at a backward's first gradient and closed when that
backward ends (an autograd engine callback), not once per gradient: each opening that
writes string attributes starts a new 4 KiB block of HDF5's global heap, which would grow
the file by that much per gradient. Readers in this process still open it meanwhile (HDF5
shares the handle); other processes can open it once the backward is over.
"""
from __future__ import annotations

import h5py
import torch

from torchlog.errors import LogFileError
from torchlog.storage import files
from torchlog.storage.format import GRADIENTS
from torchlog.storage.lazy import StoredTensor, stored_value
from torchlog.storage.values import WriteOptions, write_value

__all__ = ["GradientFile"]

_NO_BACKWARD = -1  # torch._C._current_graph_task_id() outside a backward


class GradientFile:
    """The log file at `path`, written by the backwards of the history logged into it."""

    def __init__(self, path: str, log_id: str, options: WriteOptions) -> None:
        self.path = path  # absolute
        self.log_id = log_id  # the file must still carry it: it was not overwritten meanwhile
        self.options = options
        self._file: h5py.File | None = None
        self._closing_task = _NO_BACKWARD  # the backward whose end closes the file

    def write(self, index: int, grad: torch.Tensor) -> StoredTensor:
        """Write the gradient of op `index` (its PassRecord.op_index); return its lazy stand-in.

        Raises:
            LogFileNotFoundError: the log file was moved or deleted since the forward pass.
            LogFilePermissionError: it cannot be written any more.
            LogFileError: it holds another log now (it was overwritten), it is locked by
                another process, or open read-only in this process (an h5py.File on it).
                Raised inside a tensor hook, it leaves `backward()` with its type unchanged.
        """
        name = str(index)
        with files.HANDLE_LOCK:
            file = self._open()
            try:
                group = file.require_group(GRADIENTS)
                if name in group:  # an earlier backward's: the latest is kept, as in memory
                    del group[name]
                    file.flush()  # unlinked on disk before its space is reused: never torn
                write_value(group, name, grad, f"the gradient of op #{index}", self.options)
                file.flush()
            except BaseException:
                self.close()  # leave no handle open for a backward that stops here
                raise
            if self._closing_task == _NO_BACKWARD:  # called outside a backward: nothing ends it
                self.close()
        return stored_value(self.path, self.log_id, f"{GRADIENTS}/{name}", grad.shape, grad.dtype)

    def close(self) -> None:
        """Close the file if it is open; a later gradient opens it again."""
        with files.HANDLE_LOCK:
            if self._file is not None:
                self._file.close()
            self._file = None
            self._closing_task = _NO_BACKWARD

    def _open(self) -> h5py.File:
        """The open file, opened now if needed; the backward running now will close it."""
        if self._file is None:
            file = files.open_existing(self.path, "r+")
            if file.attrs.get("log_id") != self.log_id:
                file.close()
                raise LogFileError(
                    f"cannot write gradients into {self.path!r}: the file holds another log now "
                    "(it was overwritten after this history was logged); log the model again")
            self._file = file
        # Both engine calls are private, but torch's own register_multi_grad_hook, DDP and
        # FSDP rely on them: which backward runs this hook, and a call at its end.
        task = torch._C._current_graph_task_id()
        if task != self._closing_task and task != _NO_BACKWARD:
            # A backward that raises never runs its callback; the next backward's callback
            # (or the file's garbage collection, with the autograd graph) closes the file then.
            torch.autograd.Variable._execution_engine.queue_callback(self.close)
            self._closing_task = task
        return self._file
