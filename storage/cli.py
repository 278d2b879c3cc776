"""The log-file commands of `python -m torchlog`: show, layers and render."""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torchlog.display import human_size, shape_text
from torchlog.errors import LayerNotFoundError
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


def layers(path: str, keys: Sequence[str] = ()) -> str:
    """One line per layer: label, shape, dtype and whether its activation is in the file.

    Works on logs and on extract files (then the shapes include the sample axis, and each
    line names the `layers` entries of extract that chose it). `keys` limits the lines to
    the layers they name: labels, and for an extract file the entries extract took
    (module addresses, substrings, positions); for a log, any key `history[key]` takes.

    Raises:
        LayerNotFoundError: a key that names no layer; the message lists the valid ones.
    """
    if _is_extract(path):
        acts = ActivationFile(path)
        chosen_by: dict[str, list[str]] = {}
        for entry, labels in acts.selected.items():
            for label in labels:
                chosen_by.setdefault(label, []).append(repr(entry))
        labels = _selected(acts.layers, [acts.labels_for(_entry(acts, key)) for key in keys])
        rows = [(label, acts.shapes[label], dtype_name(acts.dtypes[label]), ", ".join(chosen_by.get(label, [])))
                for label in labels]
        header, last = f"{acts!r}", "chosen by" if acts.selected else ""
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # `show` reports incomplete files; keep this a table
            history = load(path)
        labels = set(_selected([p.label for p in history], [_passes_of(history, key) for key in keys]))
        rows = [(p.label, p.shape, dtype_name(p.dtype), _saved_text(p)) for p in history if p.label in labels]
        header, last = f"{history!r} from {path!r}", "saved"
    width = max((len(label) for label, *_ in rows), default=5)
    lines = [header, f"{'layer':<{width}}  {'shape':<20}  {'dtype':<10}  {last}".rstrip()]
    for label, shape, dtype, saved in rows:
        lines.append(f"{label:<{width}}  {shape_text(shape):<20}  {dtype:<10}  {saved}".rstrip())
    return "\n".join(lines)


def _selected(labels: list[str], chosen: list[list[str]]) -> list[str]:
    """`labels` (in file order), or with keys only those they name."""
    if not chosen:
        return labels
    wanted = {label for found in chosen for label in found}
    return [label for label in labels if label in wanted]


def _entry(acts: ActivationFile, key: str) -> str | int:
    """A key from the command line: '-5' is the position entry -5 when extract took one."""
    try:
        number = int(key)
    except ValueError:
        return key
    return number if key not in acts.shapes and key not in acts.selected else key


def _passes_of(history: Any, key: str) -> list[str]:
    """The pass labels `history[key]` names (an int string is a position)."""
    try:
        found = history[int(key)] if key.lstrip("-").isdigit() else history[key]
    except IndexError as exc:
        raise LayerNotFoundError(f"position {key!r} is outside the {len(history)} layers of the log") from exc
    passes = getattr(found, "passes", (found,))
    return [p.label for p in passes]


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
        return layers(args.file, getattr(args, "keys", ()))
    out = render(args.file, args.rolled, args.output, args.format)
    return f"wrote {Path(out)}"
