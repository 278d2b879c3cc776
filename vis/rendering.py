"""Rendering: run graphviz's `dot` on the DOT source, write the file, show it in Jupyter."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchlog.errors import MissingDependencyError
from torchlog.optional import require
from torchlog.vis.build import build_graph
from torchlog.vis.dot import dot_source
from torchlog.vis.options import RenderOptions, keyword_options, resolve_options

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["ENGINE", "SOURCE_FORMAT", "GraphFile", "require_dot", "pipe", "options_from_keywords",
           "to_dot", "render", "in_notebook"]

ENGINE = "dot"
SOURCE_FORMAT = "gv"  # written as DOT text, without running `dot`
_INSTALL_DOT = (
    "install graphviz's `dot` program: `apt-get install graphviz` (Debian/Ubuntu), "
    "`brew install graphviz` (macOS) or `conda install -c conda-forge graphviz`; "
    "the DOT source is still available from history.to_dot(), and fileformat='gv' writes it")


class GraphFile(str):
    """The path of a rendered graph file; in Jupyter it displays the graph inline.

    It is a `str`, so it can be opened or compared like any path. `source` holds the
    DOT text it was rendered from.
    """

    source: str
    fileformat: str

    def __new__(cls, path: str | Path, source: str = "", fileformat: str = "") -> "GraphFile":
        obj = super().__new__(cls, str(path))
        obj.source = source
        obj.fileformat = fileformat
        return obj

    @property
    def path(self) -> Path:
        return Path(self)

    def svg(self) -> str:
        """The graph as SVG text: the written file when it is SVG, else rendered now.

        Raises:
            MissingDependencyError: graphviz or `dot` is missing.
        """
        if self.fileformat == "svg":
            return self.path.read_text(encoding="utf-8")
        return pipe(self.source, "svg").decode("utf-8")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        text = repr(str(self))
        try:
            return {"image/svg+xml": self.svg(), "text/plain": text}
        except MissingDependencyError:  # a 'gv' file written without `dot`: show the path
            return {"text/plain": text}


def _graphviz() -> Any:
    return require("graphviz", "rendering", "history.to_dot() works without it")


def require_dot(fileformat: str) -> None:
    """Check that `fileformat` can be written here: graphviz and `dot` for all but 'gv'.

    Raises:
        MissingDependencyError: the graphviz package or the `dot` program is missing;
            the message says how to install it.
    """
    if fileformat == SOURCE_FORMAT:
        return
    _graphviz()
    if shutil.which(ENGINE) is None:
        raise MissingDependencyError(f"the `{ENGINE}` program was not found on PATH; {_INSTALL_DOT}")


def pipe(source: str, fileformat: str) -> bytes:
    """Lay out DOT `source` with `dot` and return the `fileformat` bytes.

    Raises:
        MissingDependencyError: graphviz or `dot` is missing.
        subprocess.CalledProcessError: `dot` failed; its stderr is in the message.
    """
    if fileformat == SOURCE_FORMAT:
        return source.encode("utf-8")
    graphviz = _graphviz()
    require_dot(fileformat)
    try:
        return graphviz.pipe(ENGINE, fileformat, source.encode("utf-8"), quiet=True)
    except graphviz.ExecutableNotFound as exc:
        raise MissingDependencyError(f"graphviz could not run `{ENGINE}`; {_INSTALL_DOT}") from exc
    except graphviz.CalledProcessError as exc:
        exc.add_note("torchlog: `dot` failed on this graph; history.to_dot() gives its DOT source")
        raise


def options_from_keywords(**vis_keywords: Any) -> RenderOptions:
    """Options of `log_forward_pass(..., vis_opt=..., vis_*=...)`, checked before the pass runs.

    Checks every value, that the output folder exists and can be written, and that
    `dot` is installed. `display` defaults to True, since log_forward_pass returns
    the history and not the graph.

    Raises:
        InvalidOptionError: vis_opt or another value is outside the accepted set, or
            the output folder cannot be written.
        InvalidArgumentTypeError: a keyword is unknown or a value has the wrong type.
        LogFileNotFoundError: the output folder does not exist.
        MissingDependencyError: graphviz or `dot` is missing.

    Example:
        >>> options_from_keywords(vis_opt="rolled", vis_fileformat="gv").format
        'gv'
    """
    options = keyword_options(**vis_keywords)
    options.output_path()
    require_dot(options.format)
    return options


def to_dot(history: "ModelHistory", options: RenderOptions | None = None, **keywords: Any) -> str:
    """The DOT source of the graph of `history`; needs neither graphviz nor `dot`.

    Takes a RenderOptions and/or its fields as keywords (`mode='rolled'`,
    `nesting_depth=2`, ...; the `vis_` spellings work too). The text is the same for
    the same model and input: it holds no ids, timings or seeds.

    Raises:
        InvalidOptionError, InvalidArgumentTypeError: a bad option, named in the message.

    Example:
        >>> import torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.Linear(3, 2), torch.ones(1, 3))
        >>> to_dot(h, mode="rolled").startswith('digraph "Linear" {')
        True
    """
    return dot_source(build_graph(history, resolve_options(options, keywords)))


def render(history: "ModelHistory", options: RenderOptions | None = None, **keywords: Any) -> GraphFile:
    """Draw `history` with graphviz, write the file and return its path.

    Options as for `to_dot`, plus `outpath` and `fileformat`. Every option, the output
    folder and the `dot` program are checked before any drawing work. In Jupyter the
    returned path displays as the graph; with `display=True` it is also shown at once.

    Returns:
        A GraphFile: the written path as a str, with the DOT text in `.source`.

    Raises:
        InvalidOptionError, InvalidArgumentTypeError: a bad option, named in the message.
        LogFileNotFoundError: the output folder does not exist.
        MissingDependencyError: graphviz or `dot` is missing (to_dot still works).

    Example:
        >>> import tempfile, torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.Linear(3, 2), torch.ones(1, 3))
        >>> folder = tempfile.mkdtemp()
        >>> path = render(h, mode="rolled", outpath=f"{folder}/linear", fileformat="gv")
        >>> path.endswith("linear.gv"), open(path).read() == h.to_dot(mode="rolled")
        (True, True)
    """
    options = resolve_options(options, keywords)
    path = options.output_path()
    require_dot(options.format)
    source = dot_source(build_graph(history, options))
    path.write_bytes(pipe(source, options.format))
    result = GraphFile(path, source, options.format)
    if options.display and in_notebook():
        from IPython.display import display

        display(result)
    return result


def in_notebook() -> bool:
    """True inside a Jupyter kernel; never imports IPython itself."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return shell is not None and getattr(shell, "kernel", None) is not None
