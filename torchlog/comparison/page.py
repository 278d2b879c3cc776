"""What Comparison.to_html adds to run a's viewer page: marks, run b's and the difference's statistics, each row's figures."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from torchlog.comparison.differences import working_dtype
from torchlog.comparison.magnitudes import extremes
from torchlog.comparison.rows import Row, Status
from torchlog.records import PassRecord
from torchlog.statistics import TensorStats, summarize_all

if TYPE_CHECKING:
    from torchlog.comparison.result import Comparison

__all__ = ["LEGEND", "MARKS", "NOT_FINITE", "PageParts", "over_tolerance", "page_parts", "tolerance_ratio"]

# Why a pass of run a has no colour: the mark its node carries, by its row's status.
MARKS = {Status.ONLY_A: "only in a", Status.NOT_SAVED: "not saved",
         Status.NOT_COMPARABLE: "not comparable", Status.SHAPE: "shape mismatch"}
# A compared pass whose relative L2 is not finite: NaN or Inf at different places, or a is
# all zeros where b is not.
NOT_FINITE = "no finite rel. L2"
NUM_NAMED = 5  # passes only run b ran that the legend names
# Values waiting to be summarised hold at most this many elements together: many small
# values are summarised in one go, and memory stays within a few passes' bytes.
PENDING_ELEMENTS = 1 << 18
B_TITLE, ROW_TITLE = "run b", "comparison"
# The colour scale, and the panel's entry of the same number.
LEGEND = "log10(max |a - b| / tolerance), 0: within tolerance"
OVER_TITLE = "max |a - b| / tolerance"


@dataclass(slots=True)
class PageParts:
    """What the page shows beyond run a, in the viewer's terms (plain dicts and lists)."""

    values: dict[str, float]  # pass of run a -> over_tolerance of its row (its colour)
    marks: dict[str, str]  # pass of run a with no colour -> why (a MARKS name or NOT_FINITE)
    sections: dict[str, dict[str, dict[str, Any]]]  # pass of a -> panel title -> entry -> value
    notes: list[str]  # the legend's line on the passes only run b ran (not on a's graph)
    # pass of a -> panel title -> (min, max, histogram counts) of run b's value and of the difference
    histograms: dict[str, dict[str, tuple[float, float, list[int]]]] = field(default_factory=dict)


def page_parts(comparison: "Comparison") -> PageParts:
    """Colour values, marks, panel sections and legend notes of a comparison's page.

    Each pair's values are read, their difference taken in the comparison's working dtype
    (`working_dtype`) and both summarised (`torchlog.statistics`) a few pairs at a time, so
    histories opened with `torchlog.load` stay on disk.
    """
    records_a = {r.label: r for r in comparison.a}
    records_b = {r.label: r for r in comparison.b}
    parts = PageParts({}, {}, {}, [])
    pending = _Pending()
    for row in comparison.rows:
        if row.label_a is None or row.label_a not in records_a:
            continue
        record_b = None if row.label_b is None else records_b.get(row.label_b)
        charts = parts.histograms.setdefault(row.label_a, {})
        parts.sections[row.label_a] = _sections(row, records_a[row.label_a], record_b, _Chart(pending, charts))
        rel_l2 = row.rel_l2
        if rel_l2 is not None and math.isfinite(rel_l2):
            parts.values[row.label_a] = over_tolerance(row)
        elif row.status in MARKS:
            parts.marks[row.label_a] = MARKS[row.status]
        elif rel_l2 is not None:
            parts.marks[row.label_a] = NOT_FINITE
    pending.flush()
    parts.histograms = {label: charts for label, charts in parts.histograms.items() if charts}
    only_b = [row.label_b for row in comparison.rows if row.label_a is None]
    if only_b:
        more = f" and {len(only_b) - NUM_NAMED} more" if len(only_b) > NUM_NAMED else ""
        passes = "pass" if len(only_b) == 1 else "passes"
        parts.notes.append(f"{len(only_b)} {passes} only in run b, not drawn: "
                           f"{', '.join(str(l) for l in only_b[:NUM_NAMED])}{more}")
    return parts


def over_tolerance(row: Row) -> float:
    """How far outside its tolerance a compared row is, as its page colours it: log10 of
    `tolerance_ratio`, and 0 where that is at most 1 (a `match` row sits at the scale's
    neutral start, however small its tolerance).

    Example:
        >>> from torchlog.comparison.differences import Difference
        >>> from torchlog.comparison.tolerances import Tolerance
        >>> row = Row(0, 'mul_1_1', 'mul_1_1', 'mul', None, None, None, (2,), (2,), None, None,
        ...           Status.DIFFERS, Tolerance(rtol=1e-2, atol=0.0), Difference(0.5, 0.5, 0.5, 0.9))
        >>> round(tolerance_ratio(row), 6), round(over_tolerance(row), 6)  # 0.5 against 0.01 * 1.0
        (50.0, 1.69897)
    """
    ratio = tolerance_ratio(row)
    return max(0.0, math.log10(ratio)) if ratio > 0 else 0.0


def tolerance_ratio(row: Row) -> float:
    """max |a - b| / (atol + rtol * max |a|) of a compared row: at most 1 for `match`, above
    1 for `differs`. A row compared exactly (integers, tolerance 0) counts one unit as its
    tolerance; a row with no difference figures is 0."""
    diff, tolerance = row.diff, row.tolerance
    if diff is None or diff.max_abs == 0.0:
        return 0.0
    # 1 / (atol / max|a-b| + rtol / max_rel) is max|a-b| / (atol + rtol max|a|), and cannot
    # overflow where max|a| does.
    allowed = tolerance.atol / diff.max_abs + (tolerance.rtol / diff.max_rel if diff.max_rel > 0 else 0.0)
    ratio = 1.0 / allowed if allowed > 0 else diff.max_abs
    return min(ratio, 1.0) if row.status is Status.MATCH else ratio  # as `within` decided it


def _sections(row: Row, record_a: PassRecord, record_b: PassRecord | None,
              pending: "_Chart") -> dict[str, dict[str, Any]]:
    """The panel's tables of one row: run b's value, the difference, the row's figures;
    statistics are filled in when `pending` is flushed."""
    sections: dict[str, dict[str, Any]] = {}
    if record_b is not None:
        own = sections[B_TITLE] = _differing(row)
        value_a, value_b = _value(record_a), _value(record_b)
        diff = None
        if value_a is not None and value_b is not None and value_a.shape == value_b.shape:
            diff = _difference(value_a.detach(), value_b.detach().to(value_a.device))
        del value_a  # only b's value and the difference wait to be summarised
        if value_b is None:
            own["value"] = "not saved" if record_b.saved is None else "not a tensor"
        else:
            pending.add(own, value_b, B_TITLE)
            del value_b
        if diff is not None:
            title = f"difference a - b ({str(diff.dtype).removeprefix('torch.')})"
            pending.add(sections.setdefault(title, {}), diff, title)
    sections[ROW_TITLE] = _figures(row)
    return sections


def _difference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a - b in the comparison's working dtype (`working_dtype`), or in float64 (complex128)
    where that overflows: the float32 difference of finfo.max and finfo.min is inf, their
    float64 one is not. NaN and Inf of a or b stay where they are."""
    work = working_dtype(a.dtype, b.dtype)
    diff = a.to(work) - b.to(work)
    # aminmax holds a NaN or Inf when the difference does, and allocates nothing its size.
    if diff.numel() == 0 or all(math.isfinite(v) for v in torch.stack(extremes(diff)).tolist()):
        return diff
    if not bool((torch.isinf(diff) & torch.isfinite(a) & torch.isfinite(b)).any()):
        return diff
    wide = torch.complex128 if work.is_complex else torch.float64
    return a.to(wide) - b.to(wide)


def _value(record: PassRecord) -> torch.Tensor | None:
    if record.saved is None:
        return None
    value = record.tensor_contents
    return value if isinstance(value, torch.Tensor) else None


def _differing(row: Row) -> dict[str, Any]:
    """b's label, shape and dtype where they are not a's."""
    own: dict[str, Any] = {}
    if row.label_b != row.label_a:
        own["label"] = row.label_b
    if row.shape_b != row.shape_a and row.shape_b is not None:
        own["shape"] = str(tuple(row.shape_b))
    if row.dtype_b != row.dtype_a and row.dtype_b is not None:
        own["dtype"] = str(row.dtype_b).removeprefix("torch.")
    return own


def _figures(row: Row) -> dict[str, Any]:
    figures: dict[str, Any] = {"status": str(row.status)}
    if row.diff is not None:
        figures.update({"max |a - b|": row.diff.max_abs, "max rel. diff": row.diff.max_rel,
                        "rel. L2": row.diff.rel_l2, "cosine": row.diff.cosine})
    if row.local is not None:
        figures["local error (rel. L2)"] = row.local.rel_l2
    if row.status in (Status.MATCH, Status.DIFFERS):
        figures["tolerance"] = f"rtol {row.tolerance.rtol:g}, atol {row.tolerance.atol:g}"
        if row.diff is not None and math.isfinite(row.diff.rel_l2):
            figures[OVER_TITLE] = tolerance_ratio(row)
    return figures


def _stat_entries(stats: TensorStats) -> dict[str, Any]:
    """The entries the viewer's own statistics table shows, in its order."""
    entries: dict[str, Any] = {}
    if stats.min is not None:
        entries.update({"min": stats.min, "max": stats.max, "mean": stats.mean, "std": stats.std})
    entries.update({"zeros": f"{100 * stats.zeros:.1f} %", "NaN": stats.num_nan,
                    "Inf": stats.num_inf, "elements": stats.numel})
    return entries


class _Pending:
    """Tensors waiting to be summarised, with the tables their statistics go to and where
    their histograms go (a pass's charts, under a title)."""

    def __init__(self) -> None:
        self.tables: list[tuple[dict[str, Any], dict[str, Any], str]] = []
        self.values: list[torch.Tensor] = []
        self.elements = 0

    def add(self, table: dict[str, Any], value: torch.Tensor, charts: dict[str, Any], title: str) -> None:
        self.tables.append((table, charts, title))
        self.values.append(value)
        self.elements += value.numel()
        if self.elements >= PENDING_ELEMENTS:
            self.flush()

    def flush(self) -> None:
        for (table, charts, title), stats in zip(self.tables, summarize_all(self.values)):
            table.update(_stat_entries(stats))
            if stats.counts and stats.min is not None:
                charts[title] = (stats.min, stats.max, list(stats.counts))
        self.tables, self.values, self.elements = [], [], 0


@dataclass(slots=True)
class _Chart:
    """One pass's way to `_Pending`: its statistics go to a table, its histograms to `charts`."""

    pending: _Pending
    charts: dict[str, Any]

    def add(self, table: dict[str, Any], value: torch.Tensor, title: str) -> None:
        self.pending.add(table, value, self.charts, title)
