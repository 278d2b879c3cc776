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
        (per pass, the largest |effect| over its positions; a legend names the scale) and
        the page focused on the pass of largest effect. Returns the path written.

        Raises:
            LogFileNotFoundError: the folder of `path` does not exist.
        """
        from torchlog.vis.viewer import to_html  # lazily: the viewer sits above patching

        values = {label: effect for label, effect in self.effects().items() if math.isfinite(effect)}
        focus = max(values, key=lambda label: abs(values[label])) if values else None
        return to_html(self._history, path, depth=depth, focus=focus, colour_by=values,
                       colour_legend=f"{self.method} effect (0 corrupted, 1 clean)")

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
