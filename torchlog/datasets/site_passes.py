"""Which passes of the first batch's logged pass each site names, and how each later batch finds them again.

A pass is found again in one of four ways: by a forward hook on its module (the k-th
tensor of the module's c-th call), by its op call's position under the lean capture (call
number, output index: sites/resolve.py's `call_positions`) and, for a batch whose ops
changed, by its place (the n-th call of its function inside its innermost module,
capture/lean.py), by its index among forward's input tensors, or, for a pass none of these
reach (a buffer, a tensor written through a view), only by logging each batch.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torchlog.capture import Place
from torchlog.errors import InvalidOptionError, closest_matches
from torchlog.history import ModelHistory, all_passes
from torchlog.records import NodeKind, PassRecord
from torchlog.sites.entries import SITE_FORMS
from torchlog.sites.resolve import call_positions, resolve

__all__ = ["Chosen", "Selection", "select"]

_OPS = (NodeKind.OP, NodeKind.CREATED)


@dataclass(frozen=True, slots=True)
class Chosen:
    """One pass a site names on the first batch, and how a batch finds it."""

    label: str  # its label on the first batch
    how: str  # 'hook', 'op', 'input', or 'logged' (found only on a logged pass)
    key: Any  # hook: (address, call index, tensor index); op: (call, output); input: tensor index
    place: tuple[Place, int] | None = None  # op: (place, output index)


@dataclass(slots=True)
class Selection:
    """Every site's passes on the first batch, and what the lean capture must copy."""

    per_site: dict[Any, list[Chosen]]  # site -> its passes, in execution order
    order: list[str]  # every chosen label once, in execution order
    expected: list[Any]  # the first batch's op calls by name (as call_names lists them)
    wanted: dict[int, tuple[int, ...]] = field(default_factory=dict)  # call -> output indexes
    places: dict[Place, tuple[int, ...]] = field(default_factory=dict)  # place -> output indexes
    last_call: int = 0  # the last call a chosen op needs: calls after it may differ
    num_calls: int = 0  # the calls of the (possibly stopped) first batch


def select(probe: ModelHistory, sites: Sequence[Any], modules: Mapping[Any, tuple[str, int | None]],
           hooked: Sequence[Any], every_output: bool, stop_after: Any = None) -> Selection:
    """The passes `sites` name in `probe` (the first batch's logged pass).

    `modules`: site -> (address, call number or None) for module address sites; those in
    `hooked` are found by forward hooks (none with stop_after); `every_output`: a module
    site names every tensor its calls returned, as layers_to_save selects them, else only
    each call's first tensor.

    Raises:
        InvalidOptionError: a site that names nothing (with the closest names), or nothing
            before the pass stopped.
    """
    passes = all_passes(probe)
    positions = call_positions(passes)
    places = _places(passes)
    inputs = [r.op_index for r in passes if r.kind == NodeKind.INPUT]
    by_label = {p.label: p for p in passes}
    per_site: dict[Any, list[Chosen]] = {}
    for site in sites:
        records = [passes[i] for i in _find(probe, passes, site, modules.get(site), every_output, stop_after)]
        hooks = _hook_keys(probe, modules[site]) if site in hooked else {}
        per_site[site] = [_chosen(r, hooks, positions, places, inputs, by_label) for r in records]
    order = sorted({c.label for chosen in per_site.values() for c in chosen}, key=lambda l: by_label[l].op_index)
    found = Selection(per_site, order, _expected_calls(passes),
                      num_calls=max((call for call, _ in positions.values()), default=0))
    for chosen in (c for chosen in per_site.values() for c in chosen if c.how == "op"):
        call, output = chosen.key
        found.wanted[call] = tuple(sorted(set(found.wanted.get(call, ())) | {output}))
        place, output = chosen.place
        found.places[place] = tuple(sorted(set(found.places.get(place, ())) | {output}))
    found.last_call = max(found.wanted, default=0)
    return found


def _find(probe: ModelHistory, passes: list[PassRecord], site: Any, module: tuple[str, int | None] | None,
          every_output: bool, stop_after: Any) -> list[int]:
    """The op indexes of the passes `site` names in the probe, in order."""
    stopped = ""
    if probe.stopped_at is not None:
        stopped = (f" before the pass stopped after {probe.stopped_at!r} (stop_after={stop_after!r}): move "
                   f"stop_after past {site!r} or leave it out")
    if module is not None:
        address, call = module
        calls = probe.modules[address].call_outputs if address in probe.modules else ()
        chosen = calls if call is None else calls[call - 1:call]
        labels = [label for outputs in chosen for label in (outputs if every_output else outputs[:1])]
        if not labels:
            raise InvalidOptionError(f"site {site!r}: module {address!r} returned no tensor on the first "
                                     f"batch{stopped}")
        index = {p.label: p.op_index for p in passes}
        return sorted({index[label] for label in labels})
    try:
        return sorted(resolve(probe, [site]))
    except InvalidOptionError:
        near = closest_matches(str(site), probe.layer_labels + list(probe.modules))
        hint = f"; closest: {', '.join(near)}" if near else ""
        raise InvalidOptionError(
            f"site {site!r} matches no layer, module or position of this model{stopped} "
            f"({len(probe.layer_labels)} layers){hint}; a site is {SITE_FORMS}") from None


def _hook_keys(probe: ModelHistory, module: tuple[str, int | None]) -> dict[str, tuple[str, int, int]]:
    """label -> (address, call index, tensor index) of what a hooked module's calls returned."""
    address, call = module
    keys: dict[str, tuple[str, int, int]] = {}
    for index, outputs in enumerate(probe.modules[address].call_outputs):
        if call is None or index == call - 1:
            for tensor, label in enumerate(outputs):
                keys.setdefault(label, (address, index, tensor))
    return keys


def _chosen(record: PassRecord, hooks: Mapping[str, tuple], positions: Mapping[int, tuple[int, int]],
            places: Mapping[int, tuple[Place, int]], inputs: list[int], by_label: Mapping[str, PassRecord]) -> Chosen:
    """How a batch finds `record` again: its hook, else its op (a model output: the op
    that made it), else its place among the inputs, else only a logged pass."""
    if record.label in hooks:
        return Chosen(record.label, "hook", hooks[record.label])
    op = by_label[record.parents[0].label] if record.kind == NodeKind.OUTPUT and record.parents else record
    if _is_lean_op(op):
        return Chosen(record.label, "op", positions[op.op_index], places[op.op_index])
    if record.kind == NodeKind.INPUT:
        return Chosen(record.label, "input", inputs.index(record.op_index))
    return Chosen(record.label, "logged", None)


def _is_lean_op(record: PassRecord) -> bool:
    """Whether the lean capture copies this pass: an op's own output."""
    return record.kind in _OPS and "view_written_by" not in record.extra


def _places(passes: Sequence[PassRecord]) -> dict[int, tuple[Place, int]]:
    """(place, output index) of every op pass the lean capture copies, by op index."""
    found: dict[int, tuple[Place, int]] = {}
    num_at: dict[tuple[str, str], int] = {}
    place: Place = ("", "", 0)
    for record in passes:
        if not _is_lean_op(record):
            continue
        if record.output_index == 0:
            scope = (record.func_name, _module_of(record))
            num_at[scope] = num_at.get(scope, 0) + 1
            place = (*scope, num_at[scope])
        found[record.op_index] = (place, record.output_index)
    return found


def _module_of(record: PassRecord) -> str:
    """The address of the innermost module running the op ('' for the model's own forward)."""
    return record.containing_modules[0].rpartition(":")[0] if record.containing_modules else ""


def _expected_calls(passes: Sequence[PassRecord]) -> list[Any]:
    """The probe's op calls as the lean capture lists them by name: each call's op name,
    followed by its number of outputs when it returned several."""
    expected: list[Any] = []
    for record in passes:
        if not _is_lean_op(record):
            continue
        if record.output_index == 0:
            expected.append(record.func_name)
        elif record.output_index == 1:
            expected.append(2)
        else:
            expected[-1] += 1
    return expected
