"""What a caller adds to a page beside its colour numbers: marks on nodes, panel sections, legend notes.

A comparison, say, colours run a's ops by their difference from run b (`colour_by`), and with
`Annotations` marks the ops it could not compare by why ('only in a', 'not saved'), shows in
each op's panel run b's statistics and those of the difference, and notes in the legend the
ops only run b ran. The viewer knows nothing of comparisons: names, titles and values are the
caller's.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any

from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError
from torchlog.vis.viewer.colour import pass_labels

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["MAX_MARKS", "Annotations", "Grid", "annotation_data"]

# Each mark name gets a fill of its own and a dashed outline; the page has this many fills.
MAX_MARKS = 6


@dataclass(frozen=True)
class Grid:
    """A table of numbers the page draws as coloured cells (a layer x position grid of
    patching effects, say): one row per pass, a click on a cell selects its pass.

    Example:
        >>> grid = Grid('effect', rows=['add_1_2', 'add_2_4'], columns=['0', '1'],
        ...             values=[[0.0, 0.9], [0.1, None]])
        >>> grid.values[1][1] is None
        True
    """

    title: str  # what the numbers are (the grid's heading and scale)
    rows: Sequence[str]  # a pass label per row (what a click on the row's cells selects)
    columns: Sequence[str]  # a name per column (a position)
    values: Sequence[Sequence[float | None]]  # rows x columns; None: no number there


@dataclass(frozen=True)
class Annotations:
    """What `to_html`, `page_html` and `show` add to a page when given `annotations=`.

    Keys are anything `history[key]` accepts: a pass label (`linear_1_1:2`) for that pass,
    a layer label (`linear_1_1`) for each of its passes.

    Example:
        >>> notes = Annotations(marks={'relu_1_2': 'not saved'},
        ...                     sections={'linear_1_1': {'other run': {'max': 0.5, 'dtype': 'bfloat16'}}},
        ...                     notes=['2 ops only in the other run'])
        >>> notes.marks['relu_1_2']
        'not saved'
    """

    # label -> mark name: why the node has no colour value ('only in a'). With the caller's
    # colouring shown, a marked node is filled with its mark's colour and outlined dashed,
    # and the legend names each mark. A pass may not have both a mark and a colour value.
    marks: Mapping[str, str] = field(default_factory=dict)
    # label -> section title -> entry name -> value (a str, or a real number: NaN and
    # infinities are shown as such; floats kept to seven significant digits): tables the
    # panel shows below the pass's statistics, in the order given.
    sections: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    notes: Sequence[str] = ()  # lines the legend shows below the marks
    value_title: str | None = None  # heading of the saved value's statistics ('Activation')
    # label -> chart title -> entry name -> real number: bar charts (a row per entry, its bar
    # from 0) the panel shows below the sections ('effect by position': {'0': 0.1, ...}).
    bars: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    grid: Grid | None = None  # drawn in the panel of each of its rows' passes
    # label -> section title -> (lo, hi, counts): a histogram (equal bins from lo to hi) the
    # panel draws under the section of that title (run b's value, a difference).
    histograms: Mapping[str, Mapping[str, tuple[float, float, Sequence[int]]]] = field(default_factory=dict)


def annotation_data(history: "ModelHistory", annotations: Annotations | None,
                    coloured: Mapping[str, float]) -> dict[str, Any]:
    """The page's form of `annotations`: `marks` ({pass label: index}), `markNames`, `notes`,
    `sections` and `valueTitle`, each left out when empty. `coloured` holds the pass labels
    the caller's colouring gives a value.

    Sections are stored once per layout: `sections['layouts']` lists `[title, [entry names]]`,
    `sections['passes']` maps a pass label to `[[layout index, [values]], ...]`.

    Raises:
        InvalidArgumentTypeError: `annotations` is not an Annotations, a mapping or notes
            list has the wrong type, a name or title is not a str, or a value is neither a
            str nor a real number.
        InvalidOptionError: a mark name is empty, there are more than MAX_MARKS mark names,
            or a pass has both a mark and a colour value.
        LayerNotFoundError: a key names nothing in the history (the closest labels listed).

    Example:
        >>> import torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.Linear(3, 2), torch.ones(1, 3))
        >>> annotation_data(h, Annotations(marks={'linear_1_1': 'not saved'}), {})
        {'marks': {'linear_1_1': 0}, 'markNames': ['not saved']}
    """
    if annotations is None:
        return {}
    if not isinstance(annotations, Annotations):
        raise InvalidArgumentTypeError(
            f"annotations must be a torchlog.vis.viewer.Annotations, got {annotations!r:.80} of "
            f"type {type(annotations).__name__}; build one with Annotations(marks=..., sections=...)")
    data: dict[str, Any] = {}
    names, marks = _marks(history, annotations.marks, coloured)
    if marks:
        data["marks"], data["markNames"] = marks, names
    notes = _notes(annotations.notes)
    if notes:
        data["notes"] = notes
    sections = _sections(history, annotations.sections)
    if sections["passes"]:
        data["sections"] = sections
    bars = _sections(history, annotations.bars, "bars")
    if bars["passes"]:
        _check_bars(bars)
        data["bars"] = bars
    if annotations.grid is not None:
        data["grid"] = _grid(history, annotations.grid)
    histograms = _histograms(history, annotations.histograms)
    if histograms:
        data["histograms"] = histograms
    title = annotations.value_title
    if title is not None:
        if not isinstance(title, str):
            raise InvalidArgumentTypeError(f"Annotations.value_title must be a str, got {title!r}")
        data["valueTitle"] = title
    return data


def _passes(history: "ModelHistory", key: Any, what: str) -> list[str]:
    """The pass labels a key stands for."""
    if not isinstance(key, str):
        raise InvalidArgumentTypeError(
            f"Annotations.{what} keys are labels (str), got {key!r} of type {type(key).__name__}")
    return pass_labels(history, key)


def _mapping(value: Any, what: str, example: str) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise InvalidArgumentTypeError(
            f"{what} must be a mapping ({example}), got {type(value).__name__}: {value!r:.80}")
    return value


def _marks(history: "ModelHistory", given: Any, coloured: Mapping[str, float]
           ) -> tuple[list[str], dict[str, int]]:
    names: dict[str, int] = {}
    marks: dict[str, int] = {}
    for key, name in _mapping(given, "Annotations.marks", "{'relu_1_2': 'not saved'}").items():
        labels = _passes(history, key, "marks")
        if not isinstance(name, str) or not name.strip():
            raise (InvalidOptionError if isinstance(name, str) else InvalidArgumentTypeError)(
                f"Annotations.marks[{key!r}] must be a non-empty mark name (str), got {name!r}")
        index = names.setdefault(name, len(names))
        if len(names) > MAX_MARKS:
            raise InvalidOptionError(
                f"Annotations.marks uses {len(names)} mark names {list(names)!r}; a page tells "
                f"at most {MAX_MARKS} apart, so group the reasons into fewer names")
        for label in labels:
            if label in coloured:
                raise InvalidOptionError(
                    f"pass {label!r} has both the colour value {coloured[label]!r} and the mark "
                    f"{name!r} (Annotations.marks[{key!r}]); a mark says why a pass has no value, "
                    "so give it one or the other")
            marks[label] = index
    return list(names), marks


def _notes(given: Any) -> list[str]:
    if isinstance(given, str) or not isinstance(given, Sequence):
        raise InvalidArgumentTypeError(
            f"Annotations.notes must be a list of lines (str), got {type(given).__name__}: {given!r:.80}")
    for line in given:
        if not isinstance(line, str):
            raise InvalidArgumentTypeError(
                f"Annotations.notes holds {line!r} of type {type(line).__name__}; each line is a str")
    return list(given)


def _sections(history: "ModelHistory", given: Any, what: str = "sections") -> dict[str, Any]:
    layouts: dict[tuple[str, tuple[str, ...]], int] = {}
    passes: dict[str, list[list[Any]]] = {}
    example = "{'linear_1_1': {'run b': {'max': 0.5}}}"
    for key, titled in _mapping(given, f"Annotations.{what}", example).items():
        labels = _passes(history, key, what)
        entries = []
        for title, table in _mapping(titled, f"Annotations.{what}[{key!r}]", example).items():
            where = f"Annotations.{what}[{key!r}][{title!r}]"
            if not isinstance(title, str):
                raise InvalidArgumentTypeError(
                    f"{what} titles are str, got {title!r} of type {type(title).__name__} in "
                    f"Annotations.{what}[{key!r}]")
            table = _mapping(table, where, "{'max': 0.5, 'dtype': 'bfloat16'}")
            for name in table:
                if not isinstance(name, str):
                    raise InvalidArgumentTypeError(
                        f"entry names are str, got {name!r} of type {type(name).__name__} in {where}")
            layout = layouts.setdefault((title, tuple(table)), len(layouts))
            entries.append([layout, [_value(value, f"{where}[{name!r}]") for name, value in table.items()]])
        for label in labels:
            passes[label] = entries
    return {"layouts": [[title, list(names)] for title, names in layouts], "passes": passes}


def _value(value: Any, where: str) -> str | float | int:
    """A value as JSON holds it: a str, an int, a float to seven significant digits, or the
    text of NaN or an infinity."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InvalidArgumentTypeError(
            f"{where} must be a str or a real number, got {value!r:.80} of type "
            f"{type(value).__name__}; convert it (float(x), str(x)) or leave the entry out")
    if isinstance(value, Integral):
        return int(value)
    number = float(value)
    if math.isnan(number):
        return "NaN"
    if not math.isfinite(number):
        return "Inf" if number > 0 else "-Inf"
    return float(f"{number:.7g}")  # the panel shows five digits; seven keep the page small


def _check_bars(bars: dict[str, Any]) -> None:
    """A bar stands for a finite number."""
    for label, entries in bars["passes"].items():
        for layout, values in entries:
            title, names = bars["layouts"][layout]
            for name, value in zip(names, values):
                if isinstance(value, str):
                    raise InvalidArgumentTypeError(
                        f"Annotations.bars[{label!r}][{title!r}][{name!r}] is {value!r}; a bar is a "
                        "finite real number (leave the entry out, or put text in sections)")


def _grid(history: "ModelHistory", grid: Any) -> dict[str, Any]:
    """The page's form of a Grid: its rows checked against the history, its values JSON-ready."""
    if not isinstance(grid, Grid):
        raise InvalidArgumentTypeError(
            f"Annotations.grid must be a torchlog.vis.viewer.Grid, got {type(grid).__name__}: {grid!r:.80}")
    if not isinstance(grid.title, str):
        raise InvalidArgumentTypeError(f"Grid.title must be a str, got {grid.title!r}")
    rows = [pass_labels(history, _label(row))[0] for row in grid.rows]
    columns = [_label(column, "Grid.columns") for column in grid.columns]
    if len(grid.values) != len(rows):
        raise InvalidOptionError(f"Grid.values has {len(grid.values)} rows for {len(rows)} Grid.rows; "
                                 "give one list of values per row")
    values = []
    for row, found in zip(rows, grid.values):
        if len(found) != len(columns):
            raise InvalidOptionError(f"Grid.values of row {row!r} has {len(found)} values for "
                                     f"{len(columns)} columns; use None where a cell has no number")
        values.append([None if value is None else _number(value, f"Grid.values of row {row!r}")
                       for value in found])
    return {"title": grid.title, "rows": rows, "columns": columns, "values": values}


def _label(value: Any, what: str = "Grid.rows") -> str:
    if not isinstance(value, str):
        raise InvalidArgumentTypeError(f"{what} holds {value!r} of type {type(value).__name__}; give str")
    return value


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InvalidArgumentTypeError(f"{where} holds {value!r:.80} of type {type(value).__name__}; "
                                       "a cell is a real number or None")
    if not math.isfinite(value):
        raise InvalidOptionError(f"{where} holds {value!r}; a cell is a finite number or None")
    return float(f"{float(value):.7g}")


def _histograms(history: "ModelHistory", given: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """The page's form of Annotations.histograms: {pass label: {title: {lo, hi, counts}}}."""
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for key, titled in _mapping(given, "Annotations.histograms", "{'relu_1_2': {'run b': (0.0, 1.0, [3, 5])}}").items():
        labels = _passes(history, key, "histograms")
        tables = {}
        for title, histogram in _mapping(titled, f"Annotations.histograms[{key!r}]", "{'run b': (0.0, 1.0, [3, 5])}").items():
            where = f"Annotations.histograms[{key!r}][{title!r}]"
            if not isinstance(histogram, (tuple, list)) or len(histogram) != 3:
                raise InvalidArgumentTypeError(f"{where} must be (lo, hi, counts), got {histogram!r:.80}")
            lo, hi = (_number(v, where) for v in histogram[:2])
            counts = histogram[2]
            if lo > hi or not counts or not all(isinstance(c, Integral) and c >= 0 for c in counts):
                raise InvalidOptionError(f"{where} must have lo <= hi and counts of entries per bin (ints >= 0), "
                                         f"got lo {lo!r}, hi {hi!r}, counts {list(counts)!r:.80}")
            tables[str(title)] = {"lo": lo, "hi": hi, "counts": [int(c) for c in counts]}
        for label in labels:
            found[label] = tables
    return found
