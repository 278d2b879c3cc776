"""Text and table views of a Comparison: `print(comparison)` and `comparison.to_pandas()`."""
from __future__ import annotations

import linecache
import re
from typing import TYPE_CHECKING, Any

from torchlog.comparison.rows import Row, Status
from torchlog.optional import require

if TYPE_CHECKING:
    from torchlog.comparison.result import Comparison

__all__ = ["format_comparison", "source_line", "to_dataframe"]

_INDENT = "    "
_SITE = re.compile(r"^(?P<file>.+):(?P<line>\d+) in (?P<func>.+)$")  # PassRecord.call_site
_NUM_LISTED = 10


def format_comparison(comparison: "Comparison") -> str:
    """Counts per status, the first divergence with its module and call site, then the
    rows that add the most error."""
    a, b = comparison.a, comparison.b
    how = "by label" if comparison.alignment == "label" else "in execution order"
    counts = ", ".join(f"{status} {num}" for status, num in comparison.counts.items())
    lines = [f"Comparison of {a.model_name} (a, {len(a)} passes) with {b.model_name} "
             f"(b, {len(b)} passes), paired {how}:", f"{_INDENT}{counts}"]
    lines += _divergence_lines(comparison)
    ranked = comparison.adding_most(_NUM_LISTED)
    if ranked:
        what = ("local error: b's op on a's parents, against a" if comparison.has_local_errors
                else "growth of relative L2 over the parents'; log b with save_function_args=True "
                     "for local errors")
        lines.append(f"{_INDENT}Rows that add the most error ({what}):")
        lines += [_INDENT * 2 + _row_text(row) for row in ranked]
    if comparison.local_failures:
        label, why = next(iter(comparison.local_failures.items()))
        lines.append(f"{_INDENT}{len(comparison.local_failures)} ops could not be re-run for their "
                     f"local error (first: {label}: {why})")
    return "\n".join(lines)


def _divergence_lines(comparison: "Comparison") -> list[str]:
    first = comparison.first_divergence
    if first is None:
        differing = next((row for row in comparison.rows if row.status == Status.DIFFERS), None)
        if differing is None:
            return [f"{_INDENT}No divergence: every paired pass matches."]
        return [f"{_INDENT}No op adds a difference on its own; the first row that differs is "
                f"{_row_text(differing)} (its parents' differences, within tolerance, grew)"]
    more = len(comparison.origins) - 1
    lines = [f"{_INDENT}First divergence: {_row_text(first)}",
             f"{_INDENT * 2}module {first.module or '(top level)'}, function {first.func_name}"]
    sites = [("", first.call_site)] if first.call_site_b == first.call_site else \
        [("a ", first.call_site), ("b ", first.call_site_b)]
    for run, call_site in sites:
        site = source_line(call_site)
        if site is not None:
            lines.append(f"{_INDENT * 2}{run}at {site[0]}:{site[1]}: {site[2]}")
    if more:
        others = ", ".join(row.label for row in comparison.origins[1:6])
        lines.append(f"{_INDENT}{more} more origins: {others}{', ...' if more > 5 else ''}")
    return lines


def _row_text(row: Row) -> str:
    pair = row.label_a if row.label_a == row.label_b else f"{row.label_a} ~ {row.label_b}"
    parts = [f"{pair} [{row.status}]"]
    if row.diff is not None:
        parts.append(f"max abs {row.diff.max_abs:.3g}, rel L2 {row.diff.rel_l2:.3g}, "
                     f"cosine {row.diff.cosine:.6g}")
    if row.local is not None:
        parts.append(f"local rel L2 {row.local.rel_l2:.3g}")
    return "; ".join(parts)


def source_line(call_site: str | None) -> tuple[str, int, str] | None:
    """(file, line, source text) of a call site 'file.py:42 in forward'; None when unknown.

    Example:
        >>> source_line(None) is None
        True
    """
    match = _SITE.match(call_site or "")
    if match is None:
        return None
    file, line = match["file"], int(match["line"])
    return file, line, linecache.getline(file, line).strip() or "(source not available)"


def to_dataframe(comparison: "Comparison") -> Any:
    """One row per pass: labels, function, module, shapes, dtypes, status, the four
    figures of the difference and of the local error, and the tolerance."""
    pd = require("pandas", "Comparison.to_pandas()")
    return pd.DataFrame([_record(row) for row in comparison.rows])


def _record(row: Row) -> dict[str, Any]:
    figures = {}
    for prefix, diff in (("", row.diff), ("local_", row.local)):
        figures.update({f"{prefix}max_abs_diff": None if diff is None else diff.max_abs,
                        f"{prefix}max_rel_diff": None if diff is None else diff.max_rel,
                        f"{prefix}rel_l2": None if diff is None else diff.rel_l2,
                        f"{prefix}cosine": None if diff is None else diff.cosine})
    return {"label_a": row.label_a, "label_b": row.label_b, "status": str(row.status),
            "func_name": row.func_name, "module": row.module, "call_site_a": row.call_site,
            "call_site_b": row.call_site_b, "shape_a": row.shape_a,
            "shape_b": row.shape_b, "dtype_a": None if row.dtype_a is None else str(row.dtype_a),
            "dtype_b": None if row.dtype_b is None else str(row.dtype_b), **figures,
            "rtol": row.tolerance.rtol, "atol": row.tolerance.atol}
