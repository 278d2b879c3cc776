"""What an intervened pass reports: one record per action applied, in order."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from torchlog.interventions.actions import Action
from torchlog.statistics import TensorStats, summarize

__all__ = ["InterventionRecord", "intervention_records", "part_of"]

_SUMMARY = ("numel", "num_nan", "num_inf", "zeros", "min", "max", "mean", "std")
PLANE_SIDE = 32  # cells a side at most of the acted-on slice a record keeps


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
    # num_inf, zeros, min, max, mean, std, the histogram's counts) with the slice it acted on
    # (`slice`, `plane`: see _summary); None when not known (a log from an older torchlog).
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
        before = None if fired.before is None else _summary(fired.before, fired.action)
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


def _summary(value: Any, action: Any) -> dict[str, Any]:
    """The statistics a record keeps of a value, JSON-ready: those of torchlog.statistics,
    its histogram's `counts` (NUM_BINS bins from min to max), and for a value of two or
    more dimensions the first 2-D slice (the last two dimensions) the action acted on: its
    index on the leading dimensions (`slice`; zeros for an action on the whole value) and
    its means over at most PLANE_SIDE x PLANE_SIDE cells (`plane`: rows, cols and the means
    row by row, None for a cell of NaN, Inf or mask fills only)."""
    stats: TensorStats = summarize(value)
    found = {name: getattr(stats, name) for name in _SUMMARY}
    # Tuples, as a log file reads them back: a loaded record equals the one logged.
    found["counts"] = tuple(stats.counts) if stats.counts else None
    if isinstance(value, torch.Tensor) and value.dim() >= 2:
        lead = _acted_slice(value.shape, action.index if isinstance(action, Action) else None)
        found["slice"], found["plane"] = lead, _plane_means(value.detach()[tuple(lead)])
    return found


def _acted_slice(shape: torch.Size, index: Any) -> tuple[int, ...]:
    """The leading indices of the first 2-D slice an action's `index` reaches (zeros for none)."""
    lead = shape[:-2]
    if index is None or not lead:
        return (0,) * len(lead)
    # Each entry's slice number, as a view that holds one number per slice: an int or slice
    # index picks a view of it (no copy), a tensor index a copy the size of what the action saw.
    numbers = torch.arange(math.prod(lead)).reshape(*lead, 1, 1).expand(shape)
    moved = index.cpu() if isinstance(index, torch.Tensor) else \
        tuple(i.cpu() if isinstance(i, torch.Tensor) else i for i in index) if isinstance(index, tuple) else index
    reached = numbers[moved]  # the action indexed this value already: the index fits it
    if reached.numel() == 0:
        return (0,) * len(lead)
    return tuple(int(i) for i in torch.unravel_index(reached.min(), lead))


def _plane_means(plane: torch.Tensor) -> dict[str, Any]:
    """Means of a 2-D slice over at most PLANE_SIDE cells a side, NaN, Inf and mask fills
    (finfo.min and finfo.max) left out; four significant digits."""
    plane = plane.to("cpu")
    plane = plane.abs() if plane.is_complex() else plane
    kept = torch.isfinite(plane)
    if plane.dtype.is_floating_point:
        info = torch.finfo(plane.dtype)
        kept &= (plane != info.min) & (plane != info.max)
    plane = plane.to(torch.float64)
    size = (min(plane.shape[0], PLANE_SIDE), min(plane.shape[1], PLANE_SIDE))
    sums = F.adaptive_avg_pool2d(torch.where(kept, plane, 0.0)[None, None], size)[0, 0]
    shares = F.adaptive_avg_pool2d(kept.to(torch.float64)[None, None], size)[0, 0]
    means = tuple(float(f"{m:.4g}") if c > 0 else None for m, c in
                  zip((sums / shares.clamp(min=1e-300)).reshape(-1).tolist(), shares.reshape(-1).tolist()))
    return {"rows": size[0], "cols": size[1], "means": means}
