"""What an intervened pass reports: one record per action applied, in order."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torchlog.statistics import TensorStats, summarize

__all__ = ["InterventionRecord", "intervention_records", "part_of"]

_SUMMARY = ("numel", "num_nan", "num_inf", "zeros", "min", "max", "mean", "std")


@dataclass(frozen=True, slots=True)
class InterventionRecord:
    """One action applied to one pass of an intervened run (`history.interventions`)."""

    site: Any  # the site as given in `intervene`
    label: str  # the pass it changed, as this run labels it
    action: Any  # the action (its repr names it and its parameters)
    max_abs_change: float  # the largest absolute change it made to the value
    op_index: int  # the pass's position among every pass of the run
    number: int = 0  # the (site, action) pair's position in `intervene`
    # The value before the action, summarised as torchlog.statistics does (numel, num_nan,
    # num_inf, zeros, min, max, mean, std); None when not known (a log from an older torchlog).
    before: dict[str, Any] | None = None
    # For a module site, which tensor of the call it acted on: 'output 0 of 3' (a module's
    # output), 'input 1 of 2' (select.module_input); None for op sites.
    part: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The record as JSON-ready data (for log files): site and action as text."""
        params = self.action.params() if hasattr(self.action, "params") else {}
        change = self.max_abs_change
        return {"site": self.site if isinstance(self.site, (str, int)) else repr(self.site),
                "label": self.label, "action": repr(self.action),
                "action_name": getattr(self.action, "name", "call"), "params": params,
                "max_abs_change": None if math.isnan(change) else change, "op_index": self.op_index,
                "number": self.number, "before": self.before, "part": self.part}

    def __str__(self) -> str:
        part = f", {self.part}" if self.part else ""
        return f"{self.label}: {self.action!r} at site {self.site!r}{part} (max |change| {self.max_abs_change:.4g})"


def intervention_records(firings: tuple, passes: list) -> tuple[InterventionRecord, ...]:
    """The records of a pass's firings (capture's FiringRecords), labelled from its passes,
    each intervened pass marked in `extra['interventions']` (action, site, change: JSON-ready)."""
    records = []
    for fired in firings:
        record = passes[fired.firing.op_index]
        # One at a time: a value's summary then does not depend on what else fired.
        before = None if fired.before is None else _summary(summarize(fired.before))
        found = InterventionRecord(fired.firing.site, record.label, fired.action,
                                   float(fired.max_abs_change), record.op_index, fired.number, before,
                                   part_of(fired.firing))
        records.append(found)
        marks = list(record.extra.get("interventions", ()))
        marks.append(found.as_json())
        record.extra = {**record.extra, "interventions": marks}
    return tuple(records)


def part_of(firing: Any) -> str | None:
    """'output 0 of 3' or 'input 1 of 2' for a firing at a module's output or input, else None."""
    if firing.module_input is not None:
        return f"input {firing.module_input[0]} of {firing.module_input[1]}"
    if firing.module_call is not None:
        index, count = firing.module_output or (0, 1)
        return f"output {index} of {count}"
    return None


def _summary(stats: TensorStats) -> dict[str, Any]:
    """The statistics a record keeps of a value, JSON-ready (no histogram)."""
    return {name: getattr(stats, name) for name in _SUMMARY}
