"""`save_to=` of `log_generation` and `load_generation`: a whole generation in one HDF5 file."""
from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torchlog.errors import IncompleteLogWarning
from torchlog.generation.history import GenerationHistory
from torchlog.generation.stepping import LoggedStep
from torchlog.history import ModelHistory
from torchlog.optional import require

__all__ = ["GenerationSaver", "load_generation"]

_NEEDED_FOR = "log_generation(save_to=...)"


class GenerationSaver:
    """Writes a generation to one file as it runs: each step streams into a scratch log
    while it runs and is appended to the file when it ends, so the file holds every step
    done, also when generation raises or the process is killed.

    Creating it checks `path` and writes the file's header and the prompt (before the
    model runs). Raises what `storage.generation_file.GenerationFile` raises.
    """

    def __init__(self, path: Any, overwrite: bool, model_name: str, prompt: torch.Tensor,
                 num_beams: int) -> None:
        module = require("torchlog.storage.generation_file", _NEEDED_FOR)
        self._file = module.GenerationFile(path, overwrite, model_name, prompt, num_beams)
        self.path = self._file.path
        self._num_written = 0  # steps whose input ids and logits are in the file

    def run_step(self, log_step: Callable[[str], ModelHistory], step: int,
                 done: Sequence[LoggedStep]) -> ModelHistory:
        """Run step `step` as `log_step(path)` (logging it into the scratch log at `path`),
        append it, and return its history read back from the file.

        The steps in `done` get their input ids and logits written first (they are known
        only once a step has returned to generate). When the step raises, its partial log
        is kept as the file's `failed_step` and becomes the error's `torchlog_history`.
        """
        self._write_tokens(done)
        try:
            log_step(self._file.step_path(step))
        except BaseException as error:
            partial = self._file.keep_failed_step(step)
            if partial is not None and getattr(error, "torchlog_history", None) is not None:
                error.torchlog_history = partial  # the scratch log it read from is gone
            raise
        return self._file.append_step(step)

    def finish(self, done: Sequence[LoggedStep], sequences: torch.Tensor | None, failure: str | None) -> None:
        """Write what is left (the last steps' tokens, the sequences) and close the file as
        'complete', or 'incomplete' with `failure`."""
        try:
            self._write_tokens(done)
        finally:
            self._file.finish(sequences, failure)

    def _write_tokens(self, done: Sequence[LoggedStep]) -> None:
        for k in range(self._num_written, len(done)):
            self._file.add_tokens(k, done[k].input_ids, done[k].logits)
        self._num_written = len(done)


def load_generation(path: Any) -> GenerationHistory:
    """Open a generation file written by `log_generation(..., save_to=path)`.

    The steps' records are read now, their saved values only when accessed. A file of a
    generation that raised (or whose process was killed) opens with the steps done, as
    a partial generation (`gen.is_partial`), and issues an IncompleteLogWarning; the
    partial log of a step whose forward raised is `gen.failed_step`. `gen.output` is
    None: only the sequences of what generate returned are stored.

    Raises:
        MissingDependencyError: h5py is not installed (`pip install torchlog[storage]`).
        LogFileNotFoundError: no such file.
        LogFileError: not a generation file (a single log opens with `torchlog.load`),
            written by a newer torchlog, or damaged.

    Example:
        >>> import os, tempfile, torch, torchlog
        >>> class Counter(torch.nn.Module):  # next token: the last one plus one
        ...     def forward(self, ids):
        ...         return torch.nn.functional.one_hot((ids + 1) % 10, 10).float()
        >>> def greedy(model, ids):
        ...     for _ in range(3):
        ...         ids = torch.cat([ids, model(ids)[:, -1:].argmax(-1)], dim=-1)
        ...     return ids
        >>> path = os.path.join(tempfile.mkdtemp(), 'gen.h5')
        >>> _ = torchlog.log_generation(Counter(), torch.tensor([[4]]), decode=greedy, save_to=path)
        >>> gen = torchlog.load_generation(path)
        >>> gen.tokens.tolist(), gen.input_ids(2).tolist(), gen.logits(2).argmax(-1).tolist()
        ([[5, 6, 7]], [[4, 5, 6]], [7])
    """
    stored = require("torchlog.storage.generation_file", "load_generation()").read_generation(path)
    logged = [LoggedStep(step.history, step.input_ids, step.logits) for step in stored.steps]
    gen = GenerationHistory(stored.model_name, stored.prompt, logged, None, stored.sequences,
                            num_beams=stored.num_beams, path=stored.path, failed_step=stored.failed_step)
    if stored.failure is not None:
        warnings.warn(f"generation file {stored.path!r} is incomplete: {stored.failure}; "
                      f"{gen.num_steps} steps were written", IncompleteLogWarning, stacklevel=2)
    return gen
