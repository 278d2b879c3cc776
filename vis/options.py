"""RenderOptions: every choice that shapes a rendered graph, checked when it is made."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError, LogFileNotFoundError

__all__ = ["MODES", "VIS_OPTS", "DIRECTIONS", "FORMATS", "DEFAULT_FORMAT", "DEFAULT_OUTPATH",
           "RenderOptions", "check_depth", "resolve_options", "keyword_options"]

MODES = ("unrolled", "rolled", "backward")
VIS_OPTS = MODES + ("none",)
DIRECTIONS = {"bottomup": "BT", "topdown": "TB", "leftright": "LR"}
# Formats `dot -T` writes on every graphviz build; 'gv' writes the DOT source without `dot`.
FORMATS = ("pdf", "png", "svg", "jpg", "jpeg", "gif", "bmp", "ps", "eps", "tif", "tiff",
           "json", "plain", "xdot", "dot", "gv")
DEFAULT_FORMAT = "pdf"
DEFAULT_OUTPATH = "graph"
_BOOL_FIELDS = ("show_buffers", "show_legend", "show_gradients", "display")


@dataclass(frozen=True, slots=True)
class RenderOptions:
    """How to draw a history; invalid values raise when the object is made.

    Example:
        >>> RenderOptions(mode="rolled", nesting_depth=2).rankdir
        'BT'
        >>> RenderOptions(fileformat="bmp3")
        Traceback (most recent call last):
        ...
        torchlog.errors.InvalidOptionError: fileformat must be one of 'pdf', 'png', 'svg', \
'jpg', 'jpeg', 'gif', 'bmp', 'ps', 'eps', 'tif', 'tiff', 'json', 'plain', 'xdot', 'dot', 'gv', got 'bmp3'
    """

    mode: str = "unrolled"  # 'unrolled': a node per pass; 'rolled': per layer; 'backward': autograd
    nesting_depth: int | None = None  # module levels drawn as boxes; deeper ones become one node
    outpath: str | os.PathLike | None = None  # file to write ('graph' in the working folder)
    fileformat: str | None = None  # from outpath's suffix when it names a format, else 'pdf'
    direction: str = "bottomup"  # 'bottomup', 'topdown' or 'leftright'
    show_buffers: bool = False  # draw module buffers read in forward
    show_legend: bool = True  # caption with model facts and a key to the node styles
    show_gradients: bool = True  # draw gradient edges for passes that hold grad_contents
    display: bool = False  # also display the graph inline now when running in Jupyter

    def __post_init__(self) -> None:
        _check_choice("mode", self.mode, MODES)
        _check_choice("direction", self.direction, tuple(DIRECTIONS))
        check_depth(self.nesting_depth)
        if self.fileformat is not None:
            _check_choice("fileformat", self.fileformat, FORMATS)
        if self.outpath is not None and not isinstance(self.outpath, (str, os.PathLike)):
            raise InvalidArgumentTypeError(
                f"outpath must be a str or path-like, got {self.outpath!r} of type "
                f"{type(self.outpath).__name__}")
        for name in _BOOL_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise InvalidArgumentTypeError(f"{name} must be True or False, got {value!r}")

    @property
    def rankdir(self) -> str:
        """The graphviz `rankdir` of `direction`."""
        return DIRECTIONS[self.direction]

    @property
    def format(self) -> str:
        """The file format written: `fileformat`, else outpath's suffix if it is one, else pdf."""
        if self.fileformat is not None:
            return self.fileformat
        suffix = Path(self.outpath).suffix[1:].lower() if self.outpath is not None else ""
        return suffix if suffix in FORMATS else DEFAULT_FORMAT

    def output_path(self) -> Path:
        """The file the graph is written to; its folder must exist and be writable.

        `outpath` gets the format's extension unless it already ends with it; an
        existing folder as outpath gets a file named 'graph' inside it.

        Raises:
            LogFileNotFoundError: the folder does not exist.
            InvalidOptionError: the folder is a file or cannot be written.
        """
        path = Path(DEFAULT_OUTPATH if self.outpath is None else self.outpath).expanduser()
        if path.is_dir():
            path = path / DEFAULT_OUTPATH
        if path.suffix[1:].lower() != self.format:
            path = path.with_name(f"{path.name}.{self.format}")
        _check_folder(path.parent, self.outpath)
        return path


def _check_choice(name: str, value: Any, accepted: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in accepted:
        listed = ", ".join(repr(a) for a in accepted)
        raise InvalidOptionError(f"{name} must be one of {listed}, got {value!r}")


def check_depth(depth: Any, name: str = "nesting_depth", none_means: str = "every level") -> None:
    """Check a module depth: an int >= 1, or None (which means `none_means`).

    Raises:
        InvalidArgumentTypeError: not an int (bools included).
        InvalidOptionError: below 1.
    """
    if depth is None:
        return
    if isinstance(depth, bool) or not isinstance(depth, int):
        raise InvalidArgumentTypeError(
            f"{name} must be an int >= 1 or None ({none_means}), got {depth!r} of type "
            f"{type(depth).__name__}")
    if depth < 1:
        raise InvalidOptionError(
            f"{name} must be >= 1 (1 draws only the top-level modules) or None, got {depth!r}")


def _check_folder(folder: Path, outpath: Any) -> None:
    if not folder.exists():
        raise LogFileNotFoundError(
            f"cannot write the graph to {str(outpath)!r}: folder {str(folder)!r} does not exist; "
            "create it first or choose another outpath")
    if not folder.is_dir():
        raise InvalidOptionError(
            f"cannot write the graph to {str(outpath)!r}: {str(folder)!r} is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InvalidOptionError(
            f"cannot write the graph to {str(outpath)!r}: folder {str(folder)!r} is not writable")


def _keyword_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(RenderOptions))


def _plain_name(key: str) -> str:
    """`vis_opt` -> `mode`, `vis_nesting_depth` -> `nesting_depth`; plain names pass through."""
    name = key[4:] if key.startswith("vis_") else key
    return "mode" if name == "opt" else name


def resolve_options(options: RenderOptions | None, keywords: dict[str, Any]) -> RenderOptions:
    """Merge an options object and keywords (plain or `vis_` names); keywords win.

    Raises:
        InvalidArgumentTypeError: `options` is not a RenderOptions, or a keyword is unknown.
        InvalidOptionError: a value is outside the accepted set.
    """
    if options is not None and not isinstance(options, RenderOptions):
        raise InvalidArgumentTypeError(
            f"options must be a torchlog.vis.RenderOptions or None, got {options!r}")
    changes: dict[str, Any] = {}
    for key, value in keywords.items():
        name = _plain_name(key)
        if name not in _keyword_names():
            accepted = ", ".join(_keyword_names())
            raise InvalidArgumentTypeError(
                f"unknown rendering option {key!r}; accepted: {accepted} (each also as vis_<name>, "
                "and vis_opt for mode)")
        changes[name] = value
    if changes.get("mode") == "none":
        raise InvalidOptionError("mode 'none' draws nothing; use 'unrolled', 'rolled' or 'backward'")
    return replace(options or RenderOptions(), **changes)


def keyword_options(**vis_keywords: Any) -> RenderOptions:
    """Build RenderOptions from `log_forward_pass` keywords (`vis_opt`, `vis_nesting_depth`, ...).

    Checks values only; `display` defaults to True, since log_forward_pass returns the
    history and not the graph.

    Raises:
        InvalidOptionError: vis_opt or another value is outside the accepted set.
        InvalidArgumentTypeError: a keyword is unknown or a value has the wrong type.
    """
    vis_opt = vis_keywords.get("vis_opt", "unrolled")
    if not isinstance(vis_opt, str) or vis_opt not in VIS_OPTS:
        listed = ", ".join(repr(v) for v in VIS_OPTS)
        raise InvalidOptionError(f"vis_opt must be one of {listed}, got {vis_opt!r}")
    return resolve_options(RenderOptions(display=True), vis_keywords)
