"""The words on the graph: node lines, edge labels, pass ranges and the caption."""
from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from torchlog.display import human_size, shape_text
from torchlog.display import pass_ranges as passes_text  # `1-3, 5`: the name vis modules use
from torchlog.records import ModuleRecord, ParamInfo, PassRecord

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["MAX_PARAMS_SHOWN", "MAX_SHAPES_SHOWN", "FAILURE_WIDTH", "shape_text", "passes_text",
           "params_text", "pass_lines", "layer_lines", "module_lines", "arg_text", "failure_lines",
           "caption_lines"]

MAX_PARAMS_SHOWN = 4
MAX_SHAPES_SHOWN = 3
FAILURE_WIDTH = 40


def _size_line(record: PassRecord) -> str:
    return f"{shape_text(record.shape)}, {human_size(record.num_bytes)}"


def params_text(params: Sequence[ParamInfo]) -> str:
    """`params: (5, 5), (5,)`, with at most four shapes listed."""
    shapes = [shape_text(p.shape) for p in params[:MAX_PARAMS_SHOWN]]
    more = len(params) - MAX_PARAMS_SHOWN
    return "params: " + ", ".join(shapes) + (f", +{more} more" if more > 0 else "")


def pass_lines(record: PassRecord) -> tuple[str, ...]:
    """Label, output shape and size, then parameter shapes or the buffer's address."""
    lines = [record.label, _size_line(record)]
    if record.is_buffer and record.buffer_address:
        lines.insert(1, record.buffer_address)
    if record.params:
        lines.append(params_text(record.params))
    for mark in record.extra.get("interventions", ()):
        lines.append(f"intervened: {mark['action']}")
    return tuple(lines)


def layer_lines(passes: Sequence[PassRecord]) -> tuple[str, ...]:
    """Like pass_lines for a whole layer: `linear_1_1 (x4)` and its distinct shapes."""
    first = passes[0]
    title = first.layer_label + (f" (x{first.num_passes})" if first.num_passes > 1 else "")
    shapes = list(dict.fromkeys(shape_text(p.shape) for p in passes))
    lines = [title, _size_line(first) if len(shapes) == 1 else _listed(shapes, " | ")]
    if first.is_buffer and first.buffer_address:
        lines.insert(1, first.buffer_address)
    if first.params:
        lines.append(params_text(first.params))
    return tuple(lines)


def module_lines(title: str, module: ModuleRecord | None, output_shapes: Iterable[str]) -> tuple[str, ...]:
    """A collapsed module: `address (Type)`, its output shapes and its parameter count."""
    shapes = list(dict.fromkeys(output_shapes))
    lines = [title]
    if shapes:
        lines.append(_listed(shapes, ", "))
    if module is not None and module.num_params:
        lines.append(f"params: {module.num_params:,}")
    return tuple(lines)


def _listed(items: Sequence[str], sep: str) -> str:
    more = len(items) - MAX_SHAPES_SHOWN
    return sep.join(items[:MAX_SHAPES_SHOWN]) + (f" +{more} more" if more > 0 else "")


def arg_text(arg: Any) -> str:
    """Where a tensor was passed: `arg 1`, `kwarg other`, `arg 0[1]` (2nd item of a list).

    The empty path `()` (the value itself, as for a model output) gives ''.
    """
    if isinstance(arg, tuple):
        if not arg:
            return ""
        return arg_text(arg[0]) + "".join(f"[{item!r}]" for item in arg[1:])
    if isinstance(arg, str):
        return f"kwarg {arg}"
    return f"arg {arg}"


def failure_lines(failure: str | None) -> tuple[str, ...]:
    """The red node of a partial history: what raised, wrapped to a readable width."""
    text = failure or "the forward pass raised here"
    return ("forward pass failed",) + tuple(textwrap.wrap(text, FAILURE_WIDTH))


def caption_lines(history: "ModelHistory") -> tuple[str, ...]:
    """Model name, tensor count and size, parameter count (and where a partial run stopped)."""
    used = {p.address: p for record in history for p in record.params}
    num_params = sum(p.num_params for p in used.values())
    param_ops = sum(1 for record in history if record.params)
    lines = [
        history.model_name,
        f"{history.num_tensors} tensors ({human_size(history.num_bytes)}), "
        f"{num_params:,} params in {param_ops} parameter op{'' if param_ops == 1 else 's'}",
    ]
    if history.info.is_partial:
        lines.append("partial: the forward pass raised")
    return tuple(lines)
