"""Ops that return several tensors: the passes of one call, drawn as one node.

`h, c = self.cell(x, (h, c))` records one pass per returned tensor (`lstmcell_1_4` and
`lstmcell_2_5`), each with the call's parameters; the page draws the call once.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from torchlog.display import human_size
from torchlog.records import PassRecord
from torchlog.vis.text import MAX_SHAPES_SHOWN, layer_lines, pass_lines, shape_text

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["call_outputs", "call_lines"]


def call_outputs(history: "ModelHistory") -> dict[str, tuple[str, ...]]:
    """First output's label -> every output's label, for calls that returned several tensors.

    A pass with `output_index` k > 0 belongs to the call whose first output is the pass k
    ops before it, when that one has output index 0, the same function and the same inputs.
    """
    by_index = {r.op_index: r for r in history}
    groups: dict[str, list[str]] = {}
    for record in history:
        if record.output_index <= 0:
            continue
        first = by_index.get(record.op_index - record.output_index)
        if first is None or first.output_index != 0 or first.func_name != record.func_name or \
                first.parent_labels != record.parent_labels:
            continue
        groups.setdefault(first.label, [first.label]).append(record.label)
    return {first: tuple(labels) for first, labels in groups.items()}


def call_lines(records: list[PassRecord], layer_passes: list[PassRecord] | None = None) -> list[str]:
    """The node of one call: its first output's title (its layer's, given `layer_passes`),
    every output's shape and their size, then the parameters."""
    first = records[0]
    lines = list(layer_lines(layer_passes) if layer_passes else pass_lines(first))
    shapes = [shape_text(r.shape) for r in records]
    more = f" +{len(shapes) - MAX_SHAPES_SHOWN}" if len(shapes) > MAX_SHAPES_SHOWN else ""
    size = human_size(sum(r.num_bytes for r in records))
    lines[1] = f"{len(records)} outputs: " + ", ".join(shapes[:MAX_SHAPES_SHOWN]) + more + f", {size}"
    return lines
