"""Comparison: two runs compared pass by pass, with where they part; a read-only result."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any, overload

from torchlog.comparison.ranking import adding_most
from torchlog.comparison.rows import Row, Status
from torchlog.errors import InvalidArgumentTypeError, LayerNotFoundError, closest_matches
from torchlog.history import ModelHistory

__all__ = ["Comparison"]


class Comparison:
    """The result of `torchlog.compare(a, b)`: one Row per pass, in run a's execution order.

    A sequence of rows (`len`, iteration, positions); `comparison[label]` finds the row
    of a pass of run a (or of run b, for a pass only b ran). `print(comparison)` shows the
    counts per status, the first divergence with its call site, and the rows that add the
    most error.
    """

    def __init__(self, a: ModelHistory, b: ModelHistory, rows: list[Row], origins: list[Row],
                 alignment: str, local_failures: dict[str, str]) -> None:
        self.a = a  # the reference run
        self.b = b  # the run compared with it
        self.rows = rows
        self.origins = origins  # rows that differ while every paired parent matches
        self.alignment = alignment  # 'label' or 'sequence' (see torchlog.comparison.alignment)
        self.local_failures = local_failures  # label of run a -> why its op could not be re-run
        self._by_label = {row.label_b: row for row in rows if row.label_a is None}
        self._by_label.update((row.label_a, row) for row in rows if row.label_a is not None)

    @property
    def first_divergence(self) -> Row | None:
        """The earliest row that differs while every paired parent matches: where the runs
        part. None when no row does."""
        return self.origins[0] if self.origins else None

    @property
    def counts(self) -> dict[str, int]:
        """Rows per status, every status listed (zeros included), in Status order."""
        found = {str(status): 0 for status in Status}
        for row in self.rows:
            found[str(row.status)] += 1
        return found

    def to_html(self, path: str, depth: int | None = None) -> str:
        """Write the interactive viewer of run a with op nodes coloured by how far each pass
        is from run b next to its row's tolerance (log10 of max |a - b| / (atol + rtol max |a|);
        0, the scale's neutral start, for every `match` row; see
        torchlog.comparison.page.over_tolerance), focused on the first divergence. Returns the path.

        A pass with nothing to compare is marked by why: 'only in a', 'not saved', 'not
        comparable', 'shape mismatch', or 'no finite rel. L2' (NaN or Inf at different
        places); the legend names each mark and counts the passes only run b ran. A pass's
        panel shows run a's value, then run b's statistics (its label, shape and dtype where
        they are not a's), those of the difference a - b in the working dtype the comparison
        used (in float64 where that overflows), and the row's figures. Values are read a few
        pairs at a time, as `compare` reads them (see torchlog.comparison.page).

        Raises:
            LogFileNotFoundError: the folder of `path` does not exist.
        """
        from torchlog.comparison.page import LEGEND, page_parts
        from torchlog.vis.viewer import Annotations, to_html  # lazily: the viewer sits beside comparison

        parts = page_parts(self)
        first = self.first_divergence
        focus = first.label_a if first is not None and first.label_a in self.a else None
        notes = Annotations(marks=parts.marks, sections=parts.sections, notes=parts.notes,
                            value_title="run a", histograms=parts.histograms)
        return to_html(self.a, path, depth=depth, focus=focus, colour_by=parts.values,
                       colour_legend=LEGEND, annotations=notes)

    @property
    def has_local_errors(self) -> bool:
        return any(row.local is not None for row in self.rows)

    def adding_most(self, n: int = 10) -> list[Row]:
        """The `n` rows whose op adds the most error, most first: by local error (relative
        L2) when run b kept its function arguments, else by how much the relative L2 grows
        over the largest of the row's paired parents'. Rows that add nothing are left out."""
        return adding_most(self.rows, {p.label: p.parent_labels for p in self.a}, n)

    @overload
    def __getitem__(self, key: int) -> Row: ...
    @overload
    def __getitem__(self, key: str) -> Row: ...

    def __getitem__(self, key: int | str) -> Row:
        """The row at a position, or of a pass label (run a's, or run b's for only_b rows).

        Raises:
            LayerNotFoundError: no row has that label, or the position is out of range.
            InvalidArgumentTypeError: `key` is not an int or str.
        """
        if isinstance(key, str):
            row = self._by_label.get(key)
            if row is None:
                close = closest_matches(key, self._by_label)
                raise LayerNotFoundError(f"no row of this comparison has the label {key!r}; keys "
                                         f"are labels of run a (or of b for only_b rows); closest: "
                                         f"{close}")
            return row
        if isinstance(key, int) and not isinstance(key, bool):
            if not -len(self.rows) <= key < len(self.rows):
                raise LayerNotFoundError(f"position {key!r} is out of range for {len(self.rows)} rows")
            return self.rows[key]
        raise InvalidArgumentTypeError(f"comparison keys are int positions or str labels, got "
                                       f"{key!r} of type {type(key).__name__}")

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[Row]:
        return iter(self.rows)

    def summary(self) -> str:
        """The `print(comparison)` text; see torchlog.comparison.report."""
        from torchlog.comparison.report import format_comparison

        return format_comparison(self)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        first = self.first_divergence
        where = f", first divergence {first.label_a}" if first is not None else ""
        return (f"<Comparison of {self.a.model_name} and {self.b.model_name}: {len(self.rows)} rows, "
                f"{self.counts['differs']} differ{where}>")

    def to_pandas(self) -> Any:
        """One row per pass with labels, shapes, dtypes, status, differences and local error;
        imports pandas only when called.

        Raises:
            MissingDependencyError: pandas is not installed (`pip install torchlog[pandas]`).
        """
        from torchlog.comparison.report import to_dataframe

        return to_dataframe(self)
