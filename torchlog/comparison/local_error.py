"""The error an op adds on its own: run b's op re-run on run a's parent values, against a's value."""
from __future__ import annotations

import math
from typing import Any

import torch

from torchlog.comparison.alignment import Pair
from torchlog.comparison.differences import Difference, Reference
from torchlog.comparison.held_values import HeldValues
from torchlog.records import PassRecord
from torchlog.rerun import rerun
from torchlog.validation.rules import UNDEFINED_VALUES

__all__ = ["LocalErrors", "can_rerun"]

_MAX_DEPTH = 8  # b's own passes (inserted casts) re-run in a chain to reach a paired value


class _Unavailable(Exception):
    """A value the re-run needs was not saved in run a."""


def can_rerun(record: PassRecord) -> bool:
    """Whether the op kept what re-running it needs and its value is defined (not `empty`,
    not a write through another view, not `torch.autograd.grad`)."""
    return (record.func_args is not None and record.func_name not in UNDEFINED_VALUES
            and "view_written_by" not in record.extra
            and record.func_args[0] is not torch.autograd.grad)


class LocalErrors:
    """Re-runs run b's ops on run a's values, one pair at a time.

    Each parent of b's op gets its partner's value from run a, cast to the dtype (and
    moved to the device) b's parent had, finite values past its range clamped to it. A
    parent only b ran (a cast autocast or a port inserted) is itself re-run from its own
    parents, up to 8 deep. `failures` names the ops that raised when re-run (label of run
    a -> the exception), which get no local error.
    """

    def __init__(self, pairs: list[Pair]) -> None:
        self._partner = {p.b.label: p.a for p in pairs if p.a is not None and p.b is not None}
        self._b = {p.b.label: p.b for p in pairs if p.b is not None}
        self._last_call: tuple[Any, list[torch.Tensor]] | None = None
        self._exact: set[str] = set()  # b's passes whose values equal their partners' in a
        self._found: dict[str, list[str] | None] = {}  # _sources of b's passes, by label
        self._peaks: dict[str, float] = {}  # max |value| of run a's passes, where known
        self.failures: dict[str, str] = {}

    def note_exact(self, b: PassRecord) -> None:
        """Note that b's pass `b` holds exactly its partner's value in run a."""
        self._exact.add(b.label)

    def note_peak(self, a: PassRecord, peak: float | None) -> None:
        """Note max |value| of run a's pass `a` (None: not known; a NaN or Inf is not kept)."""
        if peak is not None and math.isfinite(peak):
            self._peaks[a.label] = peak

    def last_use(self, pairs: list[Pair]) -> dict[str, int]:
        """Per label of run a, the index of the last pair whose re-run reads its value."""
        use: dict[str, int] = {}
        for index, (a, b) in enumerate(pairs):
            if a is not None and b is not None and can_rerun(b):
                for label in self._sources(b, 0) or ():
                    use[label] = index
        return use

    def _sources(self, record: PassRecord, depth: int) -> list[str] | None:
        """Labels of run a's passes that b's op reads; None when some input has no source."""
        if depth == 0 and record.label in self._found:
            return self._found[record.label]
        found: list[str] | None = self._walk(record, depth)
        if depth == 0:
            self._found[record.label] = found
        return found

    def _walk(self, record: PassRecord, depth: int) -> list[str] | None:
        found: list[str] = []
        for label in record.parent_labels:
            partner, parent = self._partner.get(label), self._b.get(label)
            if partner is not None:
                found.append(partner.label)
                continue
            if parent is None or depth >= _MAX_DEPTH or not can_rerun(parent):
                return None
            inner = self._sources(parent, depth + 1)
            if inner is None:
                return None
            found += inner
        return found

    def of(self, a: PassRecord, b: PassRecord, reference: Reference | None, held: HeldValues,
           diff: Difference | None) -> Difference | None:
        """The local error of the pair (a, b): b's op on a's parents against a's value
        (`reference`, which the pair's difference was taken from).

        When every parent of b's op holds exactly its partner's value, the re-run would
        give b's own value back, so the local error is `diff` (the pair's difference) and
        nothing is re-run. None when b kept no function arguments, a value it needs was
        not saved, or the re-run raised (then noted in `failures`) or gave another shape.
        """
        if reference is None or not can_rerun(b) or self._sources(b, 0) is None:
            return None
        if diff is not None and all(label in self._exact for label in b.parent_labels):
            return diff
        try:
            value = self._output(b, held)
        except _Unavailable:
            return None
        except Exception as exc:  # the op refused a's values: say which and why, go on
            self.failures[a.label] = f"{type(exc).__name__}: {exc}"
            return None
        if value.shape != reference.value.shape:
            self.failures[a.label] = (f"re-run gave shape {tuple(value.shape)}, run a's value has "
                                      f"{tuple(reference.value.shape)}")
            return None
        return reference.difference(value)

    def _output(self, b: PassRecord, held: HeldValues) -> torch.Tensor:
        """b's output re-run on a's values; the outputs of one call (a split) are run once."""
        _, args, kwargs = b.func_args
        call = (id(args), id(kwargs))
        if self._last_call is None or self._last_call[0] != call:
            self._last_call = None  # drop the previous call's outputs before running this one
            self._last_call = (call, self._run(b, held, 0))
        outputs = self._last_call[1]
        if b.output_index >= len(outputs):
            raise IndexError(f"the re-run gave {len(outputs)} tensors, b's pass is output "
                             f"{b.output_index}")
        return outputs[b.output_index]

    def _run(self, b: PassRecord, held: HeldValues, depth: int) -> list[torch.Tensor]:
        values = {label: self._input(label, held, depth) for label in b.parent_labels}
        return rerun(b, values)

    def _input(self, label: str, held: HeldValues, depth: int) -> torch.Tensor:
        parent, partner = self._b[label], self._partner.get(label)
        if partner is None:  # only b ran it: re-run it too
            return self._run(parent, held, depth + 1)[parent.output_index]
        value = held.get(partner)
        if not isinstance(value, torch.Tensor):
            raise _Unavailable(partner.label)
        saved = parent.saved
        device = saved.device if isinstance(saved, torch.Tensor) else value.device
        return _cast(value, device, parent.dtype, self._peaks.get(partner.label))


def _cast(value: torch.Tensor, device: torch.device, dtype: torch.dtype,
          peak: float | None) -> torch.Tensor:
    """Run a's value in the dtype b's parent had. Finite values past that dtype's range
    become its largest ones, not inf: an additive mask's float32 finfo.min becomes
    bfloat16's, as b's model made it. `peak` (max |value|, None when not known) spares
    the look when nothing is past the range."""
    if dtype.is_floating_point and value.is_floating_point() and dtype != value.dtype:
        largest = torch.finfo(dtype).max
        if largest < torch.finfo(value.dtype).max and (peak is None or peak > largest):
            value = torch.where(torch.isfinite(value), value.clamp(-largest, largest), value)
    return value.to(device=device, dtype=dtype)
