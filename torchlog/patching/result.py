"""PatchResult: one row per patched site (and position), its metric and normalised effect."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["PatchResult", "PatchRow"]


@dataclass(frozen=True, slots=True)
class PatchRow:
    """One patched run: which pass (and position) got the clean value, and what it did."""

    site: Any  # the site as given
    label: str  # the pass patched, as the clean run labels it
    module: str  # the innermost module running it ('' at the top level)
    position: int | None  # the position along position_dim, or None for the whole value
    metric: float  # metric(output) of the patched corrupted run (sweep), or its estimate
    effect: float  # (metric - corrupted) / (clean - corrupted): 0 corrupted, 1 clean


class PatchResult:
    """The rows of a sweep or an attribution, in the order of the sites and positions.

    `clean_metric` and `corrupted_metric` are the metric of the two unpatched runs; `method`
    is 'sweep' or 'attribution'.
    """

    def __init__(self, rows: list[PatchRow], clean_metric: float, corrupted_metric: float,
                 method: str, history: Any = None) -> None:
        self.rows = rows
        self.clean_metric = clean_metric
        self.corrupted_metric = corrupted_metric
        self.method = method
        self._history = history  # the clean run (metadata), for to_html

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)

    def __getitem__(self, index: int) -> PatchRow:
        return self.rows[index]

    def top(self, k: int = 10) -> list[PatchRow]:
        """The k rows of largest |effect|, largest first."""
        return sorted(self.rows, key=lambda row: -abs(row.effect))[:k]

    def effects(self) -> dict[str, float]:
        """Per pass label, the largest |effect| over its positions (signed): what to colour by."""
        found: dict[str, float] = {}
        for row in self.rows:
            if row.label not in found or abs(row.effect) > abs(found[row.label]):
                found[row.label] = row.effect
        return found

    def to_html(self, path: str, depth: int | None = None) -> str:
        """Write the interactive viewer of the clean run with op nodes coloured by effect
        (per pass, the largest |effect| over its positions, on a scale from 0, symmetric
        where effects have both signs) and the page focused on the pass of largest effect.
        A patched pass's panel shows the clean and corrupted runs' metrics, its effect and
        metric (per position, as bars), and the grid of every patched pass's effects by
        position (a row per pass, in the order patched). Returns the path written.

        Raises:
            LogFileNotFoundError: the folder of `path` does not exist.
        """
        from torchlog.vis.viewer import Annotations, Grid, to_html  # lazily: the viewer sits above patching

        values = {label: effect for label, effect in self.effects().items() if math.isfinite(effect)}
        focus = max(values, key=lambda label: abs(values[label])) if values else None
        by_label: dict[str, list[PatchRow]] = {}
        for row in self.rows:
            by_label.setdefault(row.label, []).append(row)
        sections, bars = {}, {}
        for label, rows in by_label.items():
            sections[label], bars[label] = self._panel(rows)
        positions = sorted({row.position for row in self.rows if row.position is not None})
        columns = [str(p) for p in positions] or ["whole value"]
        cells = [[_finite(next((r.effect for r in reversed(rows) if r.position == column), None))
                  for column in (positions or [None])] for rows in by_label.values()]
        notes = Annotations(sections=sections, bars={k: v for k, v in bars.items() if v},
                            grid=Grid(f"{self.method} effect by position", list(by_label), columns, cells))
        return to_html(self._history, path, depth=depth, focus=focus, colour_by=values,
                       colour_legend=f"{self.method} effect (0 corrupted, 1 clean)", annotations=notes)

    def _panel(self, rows: list[PatchRow]) -> tuple[dict[str, Any], dict[str, Any]]:
        """One patched pass's panel table (the runs' metrics, its own where it has no
        positions) and bar charts (effect and metric by position)."""
        table: dict[str, Any] = {"clean run's metric": self.clean_metric,
                                 "corrupted run's metric": self.corrupted_metric}
        whole = [row for row in rows if row.position is None]
        if whole:
            table.update({"effect": whole[-1].effect, "patched run's metric": whole[-1].metric})
        placed = sorted((row for row in rows if row.position is not None), key=lambda row: row.position)
        bars = {}
        for title, field in (("effect by position", "effect"), ("patched run's metric by position", "metric")):
            found = {str(row.position): getattr(row, field) for row in placed if math.isfinite(getattr(row, field))}
            if found:
                bars[title] = found
        return {f"patching ({self.method})": table}, bars

    def to_pandas(self) -> Any:
        """A DataFrame with one row per patched run: site, label, module, position, metric, effect.

        Raises:
            MissingDependencyError: pandas is not installed (`pip install torchlog[pandas]`).
        """
        from torchlog.optional import require

        pandas = require("pandas", "pandas")
        return pandas.DataFrame([{"site": repr(r.site) if not isinstance(r.site, (str, int)) else r.site,
                                  "label": r.label, "module": r.module, "position": r.position,
                                  "metric": r.metric, "effect": r.effect} for r in self.rows])

    def __repr__(self) -> str:
        return (f"<PatchResult {self.method}: {len(self.rows)} rows, clean {self.clean_metric:.4g}, "
                f"corrupted {self.corrupted_metric:.4g}>")

    def __str__(self) -> str:
        lines = [repr(self), "  largest effects:"]
        for row in self.top(10):
            where = f" @ {row.position}" if row.position is not None else ""
            lines.append(f"    {row.label}{where} ({row.module or 'top level'}): effect {row.effect:+.3f}, "
                         f"metric {row.metric:.4g}")
        return "\n".join(lines)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
