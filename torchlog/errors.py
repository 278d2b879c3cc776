"""Every exception torchlog raises, each also inheriting the closest builtin."""
from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

__all__ = ["TorchlogError", "LayerNotFoundError", "InvalidOptionError", "InvalidArgumentTypeError",
           "ModelInputError", "NondeterministicModelError", "NestedLoggingError", "LogFileError",
           "LogFileNotFoundError", "LogFileExistsError", "LogFilePermissionError",
           "MissingDependencyError", "LintError", "TorchlogWarning", "CompiledModelWarning",
           "IncompleteLogWarning", "OpSequenceChangedWarning", "DistributedExtractError",
           "ComparisonError", "StepNotFoundError", "GenerationError", "closest_matches"]

_MAX_LISTED = 20  # LintError lists this many problems, then counts the rest


class TorchlogError(Exception):
    """Base class of every error torchlog raises on purpose."""


class LayerNotFoundError(TorchlogError, KeyError):
    """A lookup key names no layer, pass or module of the history."""

    def __str__(self) -> str:
        # KeyError's str() wraps the message in quotes; show it plainly.
        return str(self.args[0]) if self.args else ""


class InvalidOptionError(TorchlogError, ValueError):
    """An option has a value outside the accepted set."""


class InvalidArgumentTypeError(TorchlogError, TypeError):
    """An argument has the wrong type."""


class ModelInputError(TorchlogError, TypeError):
    """The inputs cannot be passed to the model's forward."""


class NondeterministicModelError(TorchlogError, RuntimeError):
    """Two forward passes with the same seed ran different operations."""


class NestedLoggingError(TorchlogError, RuntimeError):
    """log_forward_pass was called while the same thread was already logging."""


class LogFileError(TorchlogError, ValueError):
    """A file is not a readable torchlog log (corrupt, foreign, newer format)."""


class LogFileNotFoundError(TorchlogError, FileNotFoundError):
    """A log file or its folder does not exist."""


class LogFileExistsError(TorchlogError, FileExistsError):
    """A log file already exists and overwrite was not asked for."""


class LogFilePermissionError(TorchlogError, PermissionError):
    """A log file or its folder cannot be written (or read) by this process."""


class MissingDependencyError(TorchlogError, ImportError):
    """An optional dependency (graphviz, h5py, pandas, dot) is not installed."""


class LintError(TorchlogError, AssertionError):
    """A history breaks structural invariants (`torchlog.lint`); a torchlog bug or a hand edit.

    `problems` holds one line per broken invariant; the message lists them.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        lines = [f"  - {p}" for p in self.problems[:_MAX_LISTED]]
        if len(self.problems) > _MAX_LISTED:
            lines.append(f"  ... and {len(self.problems) - _MAX_LISTED} more")
        super().__init__(f"the history breaks {len(self.problems)} invariant(s):\n" + "\n".join(lines))

    def __reduce__(self) -> tuple:
        return type(self), (self.problems,)


class TorchlogWarning(UserWarning):
    """Base class of every warning torchlog issues."""


class CompiledModelWarning(TorchlogWarning):
    """A `torch.compile`d model was logged eagerly through its original module."""


class IncompleteLogWarning(TorchlogWarning):
    """A log file was opened that its writer did not finish (crash, or the model raised)."""


class OpSequenceChangedWarning(TorchlogWarning):
    """A dataset batch ran other ops than the first batch, and changed_ops='by_place' saved it from its ops' places."""


class DistributedExtractError(TorchlogError, RuntimeError):
    """Another rank of a distributed extract refused to start or failed; its message says why."""


class InterventionError(TorchlogError, RuntimeError):
    """An intervention could not be done as asked: its site matched nothing, its action
    raised or returned a value of the wrong shape, dtype or device, or the pass ran other
    ops than the logged pass its labels were found in. Names the site; an error raised by
    the action is chained, and the partial history is on `exc.torchlog_history`."""


class ComparisonError(TorchlogError, ValueError):
    """Two histories cannot be compared: one saved no values, or the runs share no op."""


class StepNotFoundError(TorchlogError, IndexError):
    """A generation has no such decoding step; the message gives the valid range."""


class GenerationError(TorchlogError, RuntimeError):
    """A logged generation could not be done as asked (a step ran the model twice over a
    cache written in place, decode returned no token sequence); the steps done are on
    `exc.torchlog_generation`."""


def closest_matches(key: str, candidates: Iterable[str], limit: int = 5) -> list[str]:
    """Return up to `limit` candidates closest to `key`, best first."""
    return difflib.get_close_matches(key, list(candidates), n=limit, cutoff=0.5)
