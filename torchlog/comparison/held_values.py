"""Saved values of run a read once and held only until the last row that reads them."""
from __future__ import annotations

from typing import Any

from torchlog.records import PassRecord

__all__ = ["HeldValues"]


class HeldValues:
    """Run a's values as rows are built in order; a value a later row reads again (as a
    parent of an op re-run for its local error) is kept until that row, then let go.

    With a history in memory this holds nothing the history does not; with one opened
    from a file it keeps reads to one per value and memory to the values still needed.
    """

    def __init__(self, last_use: dict[str, int]) -> None:
        self._last_use = last_use  # label -> index of the last row that reads it
        self._held: dict[str, Any] = {}
        self._row = 0

    def get(self, record: PassRecord) -> Any:
        """The saved value of `record` (read now unless held); None when not saved."""
        held = self._held.get(record.label)
        if held is not None:
            return held
        value = record.tensor_contents
        if value is not None and self._last_use.get(record.label, -1) > self._row:
            self._held[record.label] = value
        return value

    def keep(self, record: PassRecord, value: Any) -> None:
        """Hold `value`, already read for row `record`, if a later row reads it."""
        if value is not None and self._last_use.get(record.label, -1) > self._row:
            self._held[record.label] = value

    def next_row(self, index: int) -> None:
        """Move on to row `index`: let go of the values no row from here on reads."""
        self._row = index
        for label in [l for l in self._held if self._last_use[l] < index]:
            del self._held[label]
