"""Where each pass is drawn: its own node, its layer's node, or a collapsed module's node."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torchlog.labels import split_pass
from torchlog.records import ModuleRecord, PassRecord
from torchlog.vis.graph import Cluster
from torchlog.vis.options import RenderOptions

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["MODULE_PREFIX", "Placement", "place", "module_chain", "module_title"]

MODULE_PREFIX = "module "  # node keys of collapsed modules; labels never hold a space


@dataclass(slots=True)
class Placement:
    """The node of every visible pass and the module box of every node."""

    unit_of: dict[str, str] = field(default_factory=dict)  # pass label -> node key
    members: dict[str, list[PassRecord]] = field(default_factory=dict)  # node key -> passes
    cluster_of: dict[str, str | None] = field(default_factory=dict)  # node key -> box key
    clusters: dict[str, Cluster] = field(default_factory=dict)  # box key -> box

    def is_module(self, key: str) -> bool:
        """True when node `key` stands for a whole collapsed module."""
        return key.startswith(MODULE_PREFIX)


def place(history: "ModelHistory", options: RenderOptions) -> Placement:
    """Assign each visible pass to a node, in execution order.

    Buffers are left out unless `options.show_buffers`. In the rolled view all passes of a
    layer share the node their first pass gets.
    """
    placement = Placement()
    rolled = options.mode == "rolled"
    modules = history.modules  # a copy per call: fetch once
    layer_unit: dict[str, str] = {}
    for record in history:
        if record.is_buffer and not options.show_buffers:
            continue
        key = layer_unit.get(record.layer_label) if rolled else None
        if key is None:
            key = _node_key(record, placement, modules, options)
            if rolled:
                layer_unit[record.layer_label] = key
        placement.unit_of[record.label] = key
        placement.members.setdefault(key, []).append(record)
    return placement


def module_chain(record: PassRecord, rolled: bool) -> tuple[str, ...]:
    """The module calls holding `record`, outermost first; addresses only when rolled."""
    chain = tuple(reversed(record.containing_modules))
    if rolled:
        chain = tuple(split_pass(call)[0] for call in chain)
    return chain


def _node_key(record: PassRecord, placement: Placement, modules: dict[str, ModuleRecord],
              options: RenderOptions) -> str:
    rolled = options.mode == "rolled"
    chain = module_chain(record, rolled)
    depth = options.nesting_depth
    collapsed = depth is not None and len(chain) >= depth
    boxes = chain[:depth - 1] if collapsed else chain
    if collapsed:
        key = MODULE_PREFIX + chain[depth - 1]
    else:
        key = record.layer_label if rolled else record.label
    if key not in placement.cluster_of:
        placement.cluster_of[key] = _add_boxes(boxes, placement.clusters, modules, rolled)
    return key


def _add_boxes(boxes: tuple[str, ...], clusters: dict[str, Cluster],
               modules: dict[str, ModuleRecord], rolled: bool) -> str | None:
    for depth, key in enumerate(boxes, start=1):
        if key not in clusters:
            parent = boxes[depth - 2] if depth > 1 else None
            clusters[key] = Cluster(key, module_title(key, modules, rolled), parent, depth)
    return boxes[-1] if boxes else None


def module_title(key: str, modules: dict[str, ModuleRecord], rolled: bool) -> str:
    """`fc (Linear)`; `fc:2 (Linear)` for one of several calls; `fc (Linear) x4` rolled."""
    address, call = (key, None) if rolled else split_pass(key)
    module = modules.get(address)
    if module is None:
        return key
    if rolled:
        count = f" x{module.num_passes}" if module.num_passes > 1 else ""
        return f"{address} ({module.type_name}){count}"
    shown = key if module.num_passes > 1 else address
    return f"{shown} ({module.type_name})"
