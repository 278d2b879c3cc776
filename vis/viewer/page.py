"""One self-contained HTML page of the interactive viewer: written to a file or shown inline."""
from __future__ import annotations

import html
import json
import os
from collections.abc import Mapping
from functools import lru_cache
from importlib import resources
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING, Any

from torchlog.collector import collector_paused
from torchlog.errors import (
    InvalidArgumentTypeError, InvalidOptionError, LogFileNotFoundError, TorchlogError,
)
from torchlog.vis.options import RenderOptions, check_depth
from torchlog.vis.placement import place
from torchlog.vis.viewer.annotations import Annotations, annotation_data
from torchlog.vis.viewer.colour import colour_data
from torchlog.vis.viewer.data import page_data, scope_table
from torchlog.vis.viewer.outputs import call_outputs

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["MIN_HEIGHT_PX", "MODES", "READABLE_NODES", "ViewerPage", "ascii_html", "asset_text", "check_history",
           "check_mode", "count_nodes", "default_view", "fill_page", "page_html", "page_json", "page_node_count",
           "script_json", "script_of", "show", "to_html", "viewer_script"]

MODES = ("unrolled", "rolled")
# The default depth is the deepest one that draws at most this many nodes: about what fits
# on a laptop screen with readable text.
READABLE_NODES = 60
# Without an explicit mode, a history whose unrolled view stays above this many nodes even
# with every module collapsed opens rolled (a long loop folds into a few nodes).
MAX_UNROLLED_NODES = 1500
NOTEBOOK_HEIGHT_PX = 640
MIN_HEIGHT_PX = 240
# The page's script, in order. The parts share one function scope (state, helpers), so
# the page stays a classic inline script: notebooks may refuse modules and blob URLs.
SCRIPT_PARTS = ("graph.js", "repeats.js", "layout.js", "draw.js", "overview.js", "motion.js", "navigate.js", "search.js",
                "panel.js", "charts.js", "grid.js", "colour.js", "controls.js")


class ViewerPage(str):
    """The HTML text of a viewer page (ASCII only); shown inline as a notebook cell's result.

    It is a `str`; `_repr_html_` wraps it in an iframe (`srcdoc`), which JupyterLab, the
    classic notebook and VS Code all display with no extension installed, in a frame
    `height` pixels high that the reader can resize by its bottom edge. The page holds no
    character beyond ASCII, so a host page in any encoding shows it unchanged.
    """

    height: int = NOTEBOOK_HEIGHT_PX

    def sized(self, height: int) -> "ViewerPage":
        """The same page shown `height` pixels high (at least MIN_HEIGHT_PX).

        Raises:
            InvalidArgumentTypeError: `height` is not an int.
            InvalidOptionError: `height` is below MIN_HEIGHT_PX.
        """
        if not isinstance(height, int) or isinstance(height, bool):
            raise InvalidArgumentTypeError(
                f"height must be an int number of pixels, got {height!r} of type {type(height).__name__}")
        if height < MIN_HEIGHT_PX:
            raise InvalidOptionError(f"height must be >= {MIN_HEIGHT_PX} pixels, got {height!r}")
        page = ViewerPage(self)
        page.height = height
        return page

    def _repr_html_(self) -> str:
        # The frame sits in a box the reader can resize; the box's bottom strip holds the
        # handle, which the frame would otherwise cover.
        return (f'<div class="torchlog-frame" style="resize: vertical; overflow: hidden; '
                f'height: {self.height}px; min-height: {MIN_HEIGHT_PX}px; padding-bottom: 8px; '
                'box-sizing: border-box; border: 1px solid #ccc">'
                f'<iframe srcdoc="{html.escape(str(self), quote=True)}" '
                'style="width: 100%; height: 100%; border: 0; display: block" '
                'sandbox="allow-scripts allow-downloads allow-popups"></iframe></div>')


def check_mode(mode: Any) -> None:
    """Raises InvalidOptionError: `mode` is neither 'unrolled', 'rolled' nor None."""
    if mode is not None and (not isinstance(mode, str) or mode not in MODES):
        raise InvalidOptionError(
            f"mode must be 'unrolled', 'rolled' or None (choose for me), got {mode!r}")


def check_history(history: Any) -> None:
    """Raises InvalidArgumentTypeError (not a ModelHistory) or TorchlogError (no ops)."""
    from torchlog.history import ModelHistory  # vis reads histories; imported late like the API

    if not isinstance(history, ModelHistory):
        raise InvalidArgumentTypeError(
            f"the viewer needs a torchlog ModelHistory, got {type(history).__name__}; "
            "use torchlog.log_forward_pass(model, x) or torchlog.load('run.h5')")
    if len(history) == 0:
        raise TorchlogError(
            f"{history!r} holds no ops, so there is nothing to show; check that the model's "
            "forward ran any torch operation")


def count_nodes(history: "ModelHistory", mode: str, depth: int | None) -> int:
    """Nodes the graph draws at `depth` (the graphviz view's placement, buffers hidden)."""
    return len(place(history, RenderOptions(mode=mode, nesting_depth=depth)).members)


def page_node_count(history: "ModelHistory", mode: str, depth: int | None,
                    table: tuple[dict[str, tuple[str, ...]], dict[str, Any]] | None = None) -> int:
    """Nodes the page draws at `depth`: as `count_nodes`, with plumbing folded and each call
    that returned several tensors drawn once (buffers hidden)."""
    scopes, plumbing = table or scope_table(history)
    folded = {key.rsplit(":", 1)[0] if mode == "rolled" else key for key in plumbing}
    joined = {label for labels in call_outputs(history).values() for label in labels[1:]}
    units: set[str] = set()
    layer_unit: dict[str, str] = {}
    for record in history:
        if record.is_buffer or record.label in joined:
            continue
        if mode == "rolled" and record.layer_label in layer_unit:
            continue
        chain = [k.rsplit(":", 1)[0] if mode == "rolled" else k for k in reversed(scopes[record.label])]
        unit = record.layer_label if mode == "rolled" else record.label
        for i, key in enumerate(chain):
            if key in folded or (depth is not None and i + 1 >= depth):
                unit = "module " + key
                break
        layer_unit[record.layer_label] = unit
        units.add(unit)
    return len(units)


def default_view(history: "ModelHistory", mode: str | None, depth: int | None) -> tuple[str, int | None]:
    """The view a page opens with: `mode` and `depth` when given, else readable choices.

    The depth is the deepest that draws at most READABLE_NODES nodes (1 when even that is
    more), plumbing folded; None means every module expanded.
    """
    max_depth = max((len(r.containing_modules) for r in history), default=0)
    table = scope_table(history)
    if mode is None:
        mode = "unrolled"
        unrolled = page_node_count(history, "unrolled", 1, table)
        if unrolled > MAX_UNROLLED_NODES and page_node_count(history, "rolled", 1, table) < unrolled:
            mode = "rolled"
    if depth is not None:
        return mode, depth
    for candidate in range(max_depth + 1, 0, -1):
        if page_node_count(history, mode, candidate, table) <= READABLE_NODES:
            return mode, None if candidate > max_depth else candidate
    return mode, 1


@lru_cache(maxsize=None)
def _asset(name: str) -> str:
    root = resources.files("torchlog.vis.viewer")
    folder = "vendor" if name.endswith("graphviz.js") else "assets"
    return (root / folder / name).read_text(encoding="utf-8")


@lru_cache(maxsize=None)
def viewer_script() -> str:
    """The viewer's JavaScript: its parts inside one strict function, without the comment
    lines and indentation that are there for its readers (a sixth of its size)."""
    return script_of(SCRIPT_PARTS)


@lru_cache(maxsize=None)
def script_of(parts: tuple[str, ...]) -> str:
    """Asset scripts `parts` joined inside one strict function (one shared scope), comment
    lines and indentation left out."""
    body = "\n".join(_asset(name) for name in parts)
    lines = (line.strip() for line in body.splitlines())
    body = "\n".join(line for line in lines if line and not line.startswith("//"))
    return f'(function () {{\n"use strict";\n{body}\n}})();\n'


def asset_text(name: str) -> str:
    """The text of one of the viewer's asset files (`assets/`, or `vendor/graphviz.js`)."""
    return _asset(name)


def script_json(data: Any) -> str:
    """JSON safe inside <script>: no `</script>` or `<!--` can end the element early."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def page_html(history: "ModelHistory", mode: str | None = None, depth: int | None = None,
              focus: str | None = None, with_stats: bool = True,
              colour_by: Mapping[str, float] | None = None,
              colour_legend: str | None = None, *,
              annotations: Annotations | None = None) -> ViewerPage:
    """The complete viewer page for `history` as one HTML string.

    `focus` (any key of the history: a label, `label:pass` or module address) opens the
    page centred on that node, with the modules around it expanded and its panel open.
    `colour_by` maps labels (a pass, or a layer for all its passes) to numbers; the page
    then opens with op nodes coloured by them on a scale titled `colour_legend` (see
    `torchlog.vis.viewer.colour`); a collapsed module or rolled layer takes the value of
    largest magnitude among its passes. `annotations` (see
    `torchlog.vis.viewer.annotations`) adds marks on nodes with no value (the legend names
    them; a collapsed node takes a mark only when none of its passes has a value), tables
    in the panel of each pass and notes in the legend; marks or notes without `colour_by`
    colour by no number (every other node "no value").

    Raises:
        InvalidArgumentTypeError: `history` is not a ModelHistory, `depth` not an int,
            `colour_by` not a mapping of labels to real numbers, or `annotations` not an
            Annotations of the documented types.
        InvalidOptionError: `mode` is not 'unrolled', 'rolled' or None, `depth` < 1, a
            `colour_by` value is NaN or infinite, or a mark is empty, one of more than six
            names, or given to a pass that has a colour value.
        LayerNotFoundError: `focus`, a `colour_by` key or an `annotations` key names
            nothing in the history.
        TorchlogError: the history holds no ops.
    """
    text = page_json(history, mode, depth, focus, with_stats, colour_by, colour_legend, annotations=annotations)
    return fill_page(history.model_name, text)


def page_json(history: "ModelHistory", mode: str | None = None, depth: int | None = None,
              focus: str | None = None, with_stats: bool = True,
              colour_by: Mapping[str, float] | None = None,
              colour_legend: str | None = None, *,
              annotations: Annotations | None = None) -> str:
    """The data `page_html` puts in the page, as the page holds it (JSON safe in a script).

    Raises:
        TorchlogError: for a bad argument, the subclass `page_html` names.
    """
    check_history(history)
    check_mode(mode)
    check_depth(depth, "depth", "a readable default")
    colour = colour_data(history, colour_by, colour_legend)
    extra = annotation_data(history, annotations, {} if colour is None else colour["values"])
    if colour is None and ("marks" in extra or "notes" in extra):
        colour = colour_data(history, {}, colour_legend)
    if colour is not None:
        colour.update((key, extra.pop(key)) for key in ("marks", "markNames", "notes") if key in extra)
    with collector_paused():  # many small acyclic objects: no sweeps meanwhile
        pick_depth = depth is None
        mode, depth = default_view(history, mode, depth)
        data = page_data(history, mode, depth, with_stats)
        if pick_depth:
            data["view"]["pickDepth"] = True  # the page may open shallower, to stay readable
        if focus is not None:
            found = history[focus]  # raises LayerNotFoundError listing the closest labels
            data["view"]["focus"] = found.label
        if colour is not None:
            data["colour"] = colour
        data.update(extra)  # the panel's sections and value title
        return script_json(data)


def fill_page(title: str, data_json: str) -> ViewerPage:
    """The viewer page around `data_json` (page data as `script_json` writes it)."""
    page = Template(_asset("page.html")).substitute(
        title=ascii_html(title), style=_asset("viewer.css"),
        data=data_json, graphviz=_asset("graphviz.js"), viewer=viewer_script())
    return ViewerPage(page)


def ascii_html(text: str) -> str:
    """`text` escaped for HTML, characters beyond ASCII as character references."""
    return html.escape(text).encode("ascii", "xmlcharrefreplace").decode("ascii")


def _output_path(path: Any) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentTypeError(
            f"path must be a str or path-like, got {path!r} of type {type(path).__name__}")
    target = Path(path).expanduser()
    if target.is_dir():
        raise InvalidOptionError(f"path {str(path)!r} is a folder; give a file name such as "
                                 f"{str(target / 'graph.html')!r}")
    if not target.parent.is_dir():
        raise LogFileNotFoundError(
            f"cannot write the viewer to {str(path)!r}: folder {str(target.parent)!r} does not "
            "exist; create it first or choose another path")
    return target


def to_html(history: "ModelHistory", path: str | os.PathLike, mode: str | None = None,
            depth: int | None = None, focus: str | None = None,
            colour_by: Mapping[str, float] | None = None, colour_legend: str | None = None, *,
            annotations: Annotations | None = None) -> str:
    """Write the interactive viewer of `history` to one self-contained HTML file.

    The page loads nothing from the network. `mode` ('unrolled' or 'rolled') and `depth`
    (modules this deep and deeper drawn as one node) set the view it opens with; None picks
    a readable one; `focus` opens it centred on one layer; `colour_by` (label -> number)
    and `colour_legend` colour the op nodes, and `annotations` adds marks, panel tables and
    legend notes, as `page_html` says. Returns the path written.

    Given a GenerationHistory, it writes the generation's viewer: one step's graph at a
    time with a step control, and a site's statistics over the steps (`mode` and `depth`
    apply to every step; see `torchlog.vis.viewer.generation`).

    Raises:
        LogFileNotFoundError: the folder of `path` does not exist.
        InvalidOptionError: a bad mode or depth, a NaN or infinite colour value, a bad
            mark (see `page_html`), or `path` is a folder.
        InvalidArgumentTypeError: `history` is not a ModelHistory, `path` not a path,
            `colour_by` not a mapping of labels to numbers, or `annotations` of a wrong type.
        LayerNotFoundError: `focus`, a `colour_by` key or an `annotations` key names
            nothing in the history.
        TorchlogError: the history holds no ops.

    Example:
        >>> import tempfile, os, torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.Linear(3, 2), torch.ones(1, 3))
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     written = to_html(h, os.path.join(tmp, "linear.html"))
        ...     os.path.basename(written), os.path.getsize(written) > 100_000
        ('linear.html', True)
    """
    target = _output_path(path)
    page = _generation_page(history, mode, depth, focus, colour_by, annotations)
    if page is None:
        page = page_html(history, mode, depth, focus, colour_by=colour_by, colour_legend=colour_legend,
                         annotations=annotations)
    target.write_text(page, encoding="utf-8")
    return str(target)


def show(history: "ModelHistory", mode: str | None = None, depth: int | None = None,
         focus: str | None = None, height: int | None = None,
         colour_by: Mapping[str, float] | None = None, colour_legend: str | None = None, *,
         annotations: Annotations | None = None) -> ViewerPage:
    """The viewer of `history` for a notebook: display the returned page (it shows inline).

    Returns the page; as the last expression of a Jupyter cell it displays itself in a
    frame `height` pixels high (default 640), which the reader can resize by its bottom edge.
    `colour_by`, `colour_legend` and `annotations` colour and annotate the op nodes, as
    `page_html` says. A GenerationHistory shows the generation's viewer, as `to_html` says.

    Raises:
        TorchlogError: as `page_html` says.
        InvalidOptionError: `height` is an int below 240.
        InvalidArgumentTypeError: `height` is not an int.
    """
    page = _generation_page(history, mode, depth, focus, colour_by, annotations)
    if page is None:
        page = page_html(history, mode, depth, focus, colour_by=colour_by, colour_legend=colour_legend,
                         annotations=annotations)
    return page if height is None else page.sized(height)


def _generation_page(history: Any, mode: str | None, depth: int | None, focus: str | None,
                     colour_by: Any, annotations: Any) -> ViewerPage | None:
    """The generation viewer (`generation.generation_html`) when `history` is a
    GenerationHistory, else None."""
    from torchlog.vis.viewer.generation import generation_html, is_generation

    if not is_generation(history):
        return None
    given = [name for name, value in (("focus", focus), ("colour_by", colour_by), ("annotations", annotations))
             if value is not None]
    if given:
        raise InvalidOptionError(
            f"{', '.join(given)} colour or annotate one history; a generation's viewer takes mode and "
            "depth only: pass gen.steps[k] for one step, or use torchlog.vis.viewer.generation_html("
            "gen, step=..., site=...) to open at a step and site")
    return generation_html(history, mode=mode, depth=depth)
