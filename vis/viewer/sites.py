"""Call sites as the page shows them: a short file path, the line, the function, the source text."""
from __future__ import annotations

import linecache
import os
import re
from typing import Any

__all__ = ["short_path", "site_entry"]

_SITE = re.compile(r"^(?P<file>.*):(?P<line>\d+) in (?P<func>.*)$")


def site_entry(call_site: str | None, text: str | None = None) -> dict[str, Any] | None:
    """`{'file', 'line', 'func', 'text'}` of a call site written as `PassRecord.call_site` is.

    `text` is the source line when the history recorded it; otherwise the line is read from
    the file now (None when it cannot be read).

    Example:
        >>> site_entry("/no/such/model.py:12 in forward", "return torch.cat([a, b])")["text"]
        'return torch.cat([a, b])'
    """
    if call_site is None:
        return None
    match = _SITE.match(call_site)
    if match is None:
        return {"file": call_site, "line": None, "func": None, "text": text}
    file, line = match["file"], int(match["line"])
    if text is None:
        text = linecache.getline(file, line).strip() or None
    return {"file": short_path(file), "line": line, "func": match["func"], "text": text}


def short_path(file: str) -> str:
    """`file` as a reader finds it: relative to the working directory when inside it, from the
    package down when installed (`transformers/models/gpt2/modeling_gpt2.py`), else whole.

    Example:
        >>> short_path("/usr/lib/python3/site-packages/transformers/activations.py")
        'transformers/activations.py'
    """
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in file:
            return file.rsplit(marker, 1)[1]
    try:
        relative = os.path.relpath(file)
    except ValueError:  # another drive on Windows
        return file
    return file if relative.startswith("..") else relative
