"""The log-file commands of `python -m torchlog`: show, layers and render."""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from torchlog.display import human_size, shape_text
from torchlog.storage import files
from torchlog.storage.arrays import ActivationFile
from torchlog.storage.format import EXTRACT_FORMAT_NAME, dtype_name
from torchlog.storage.reader import load

__all__ = ["show", "layers", "render", "run"]


def show(path: str) -> str:
    """The summary `print(history)` gives for the log at `path`."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text = str(load(path))
    return "\n".join([f"warning: {w.message}" for w in caught] + [text])


def layers(path: str) -> str:
    """One line per layer: label, shape, dtype and whether its activation is in the file.

    Works on logs and on extract files (then the shapes include the sample axis).
    """
    if _is_extract(path):
        acts = ActivationFile(path)
        rows = [(label, acts.shapes[label], dtype_name(acts.dtypes[label]), "") for label in acts]
        header = f"{acts!r}"
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # `show` reports incomplete files; keep this a table
            history = load(path)
        rows = [(p.label, p.shape, dtype_name(p.dtype), _saved_text(p)) for p in history]
        header = f"{history!r} from {path!r}"
    width = max((len(label) for label, *_ in rows), default=5)
    lines = [header, f"{'layer':<{width}}  {'shape':<20}  {'dtype':<10}  saved"]
    for label, shape, dtype, saved in rows:
        lines.append(f"{label:<{width}}  {shape_text(shape):<20}  {dtype:<10}  {saved}".rstrip())
    return "\n".join(lines)


def render(path: str, rolled: bool, out: str, fileformat: str | None) -> str:
    """Render the log's graph to `out` with torchlog.vis; return the written path."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        history = load(path)
    mode = "rolled" if rolled else "unrolled"
    return str(history.render_graph(mode=mode, outpath=out, fileformat=fileformat))


def _is_extract(path: str) -> bool:
    with files.open_existing(path) as file:
        found = file.attrs.get("format")
    return (found.decode() if isinstance(found, bytes) else found) == EXTRACT_FORMAT_NAME


def _saved_text(record: Any) -> str:
    if record.saved is None:
        return "-"
    return human_size(record.num_bytes)


def run(command: str, args: Any) -> str:
    """Run one command with the parsed arguments; return what to print."""
    if command == "show":
        return show(args.file)
    if command == "layers":
        return layers(args.file)
    out = render(args.file, args.rolled, args.output, args.format)
    return f"wrote {Path(out)}"
