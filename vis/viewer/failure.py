"""Where a partial history stopped, as the page draws it: the op that raised and its inputs."""
from __future__ import annotations

import re
import textwrap
from typing import TYPE_CHECKING, Any

from torchlog.vis.text import FAILURE_WIDTH, arg_text, shape_text
from torchlog.vis.viewer.sites import site_entry

if TYPE_CHECKING:
    from torchlog.history import ModelHistory
    from torchlog.records import FailedOp

__all__ = ["failure_entry"]

# The API's wording of a failure (`torchlog.api._describe_failure`): which op, and where.
_OP = re.compile(r"^op '(?P<func>[^']+)' (?:in module '(?P<module>[^']+)' \(call (?P<call>\d+)\)|at the)")
_MODULE = re.compile(r" in module '(?P<module>[^']+)' \(call (?P<call>\d+)\)")


def failure_entry(history: "ModelHistory") -> dict[str, Any] | None:
    """The failure of a partial history: what raised, in which module call, with which inputs.

    None for a history that ran to the end. `func` is the torch function that raised (None
    when Python code between ops raised), `module` the module call it ran in (None at the
    top level), `site` its call site with the source line (as a pass's `site`), `args` each
    tensor argument's source (a pass label, a parameter's address, or None), shape, dtype
    and argument slot, `lines` the red node's text.

    Example:
        >>> import torch, torchlog
        >>> class Cat(torch.nn.Module):
        ...     def forward(self, x):
        ...         return torch.cat([x, x[None]])
        >>> try:
        ...     torchlog.log_forward_pass(Cat(), torch.ones(2, 3))
        ... except RuntimeError as e:
        ...     entry = failure_entry(e.torchlog_history)
        >>> entry["func"], entry["module"], entry["lines"][:2]
        ('cat', None, ['cat raised RuntimeError', 'inputs: (2, 3), (1, 2, 3)'])
        >>> entry["site"]["func"], entry["args"][1]
        ('forward', ['getitem_1_1', [1, 2, 3], 'float32', 'arg 0[1]'])
    """
    info = history.info
    if not info.is_partial:
        return None
    text = info.failure or "the forward pass raised here"
    op, where = _OP.match(text), _MODULE.search(text)
    failed = info.failed_op
    func = failed.func_name if failed is not None else op["func"] if op else None
    module = f"{where['module']}:{where['call']}" if where else None
    site = site_entry(failed.call_site, failed.source_line) if failed is not None else None
    args = _args(history, failed)
    kind = (info.error or "an error").split(":", 1)[0]
    lines = [f"{func} raised {kind}" if func else f"Python code raised {kind}"]
    if args:
        lines.append("inputs: " + ", ".join(shape_text(a[1]) if a[1] is not None else "?" for a in args))
    message = (info.error or "").split(":", 1)[-1].strip()
    lines += textwrap.wrap(message, FAILURE_WIDTH)[:3]
    return {"text": text, "error": info.error, "func": func, "module": module, "site": site,
            "args": args, "lines": lines, "parents": list(info.failed_parents)}


def _args(history: "ModelHistory", failed: "FailedOp | None") -> list[list[Any]]:
    """[source, shape, dtype, slot] of each tensor the op received: as recorded when it
    raised, or for a history without that record (an older log file) from its parents."""
    if failed is not None:
        return [[a.source, None if a.shape is None else list(a.shape),
                 str(a.dtype).removeprefix("torch."), arg_text(a.arg)] for a in failed.args]
    args = []
    for label in history.info.failed_parents:
        record = history.get(label)
        if record is not None:
            args.append([label, list(record.shape), str(record.dtype).removeprefix("torch."), None])
    return args
