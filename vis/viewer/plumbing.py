"""Ops that run outside every module, grouped so they do not crowd the first view.

A transformer builds its causal mask and position ids in helper functions and in its own
forward, outside any submodule, so no depth setting hides them (about 25 of GPT-2's first
59 nodes). The page puts them in scopes of their own, drawn collapsed like a module until
opened (or until "show plumbing" is ticked):

- a *helper* scope: a run of consecutive ops whose call site is a function other than a
  `forward` (`masking_utils.py` in `sdpa_mask`, `eager_mask`, ...), one scope per run,
  named by the file (`masking_utils:1`);
- a *fold*: a connected chain of two or more index, view, mask and integer ops left in a
  forward (`arange -> add -> unsqueeze` of position ids), drawn as one node `3 index ops`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING

from torchlog.records import NodeKind, PassRecord

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["HELPER", "FOLD", "PlumbingScope", "is_plumbing", "plumbing_scopes"]

HELPER = "helper"
FOLD = "fold"
# Torch functions that move, index or reshape values without changing them (plus `arange`):
# with any op giving integers or booleans (comparisons, masks, positions), what position ids
# and masks are made of. Ops that change float values (`where`, `masked_fill`) are not.
PLUMBING_FUNCS = frozenset({
    "__getitem__", "arange", "view", "reshape", "unsqueeze", "squeeze", "expand", "expand_as",
    "flatten", "unflatten", "contiguous", "transpose", "permute", "to", "narrow", "select",
    "index_select",
})
_SITE = re.compile(r"^(?P<file>.*):\d+ in (?P<func>.*)$")
_OUTSIDE = (NodeKind.INPUT, NodeKind.OUTPUT, NodeKind.BUFFER)


@dataclass(frozen=True, slots=True)
class PlumbingScope:
    """One helper run or fold: its key (`masking_utils:1`), kind and what the page says of it."""

    key: str
    kind: str  # HELPER or FOLD
    title: str  # 'masking_utils (helper): sdpa_mask, eager_mask +2' or '3 index ops'
    members: tuple[str, ...]  # pass labels, in execution order


def plumbing_scopes(history: "ModelHistory", scoped: set[str]) -> list[PlumbingScope]:
    """The helper runs and folds of `history`'s ops outside every module and functional.

    `scoped` holds the labels that already sit in a module or functional call.
    """
    loose = [r for r in history if r.label not in scoped and r.kind not in _OUTSIDE]
    helpers = _helper_runs(history, loose, scoped)
    in_helper = {label for scope in helpers for label in scope.members}
    folds = _folds([r for r in loose if r.label not in in_helper])
    return helpers + folds


def _site(record: PassRecord) -> tuple[str, str] | None:
    match = _SITE.match(record.call_site or "")
    return (match["file"], match["func"]) if match else None


def _helper_runs(history: "ModelHistory", loose: list[PassRecord], scoped: set[str]) -> list[PlumbingScope]:
    """Consecutive loose ops whose call site is one file's functions other than `forward`."""
    loose_labels = {r.label for r in loose}
    runs: list[tuple[str, list[PassRecord]]] = []
    current: tuple[str, list[PassRecord]] | None = None
    for record in history:
        if record.kind in (NodeKind.INPUT, NodeKind.OUTPUT):
            continue
        site = _site(record) if record.label in loose_labels else None
        helper = site is not None and site[1] != "forward" and not site[1].startswith("<")
        if not helper:
            if record.label in scoped or record.label in loose_labels:
                current = None  # a module call or the forward's own op ends a run
            continue
        stem = PurePath(site[0]).stem
        if current is None or current[0] != stem:
            current = (stem, [])
            runs.append(current)
        current[1].append(record)
    scopes, seen = [], {}
    for stem, members in runs:
        if len(members) < 2:
            continue
        seen[stem] = seen.get(stem, 0) + 1
        funcs = list(dict.fromkeys(_site(r)[1] for r in members))
        names = ", ".join(funcs[:2]) + (f" +{len(funcs) - 2}" if len(funcs) > 2 else "")
        scopes.append(PlumbingScope(f"{stem}:{seen[stem]}", HELPER, f"{stem} (helper): {names}",
                                    tuple(r.label for r in members)))
    return scopes


def is_plumbing(record: PassRecord) -> bool:
    """An index, view, mask or creation op, or any op giving integers or booleans."""
    dtype = record.dtype
    return record.func_name in PLUMBING_FUNCS or not (dtype.is_floating_point or dtype.is_complex)


def _folds(loose: list[PassRecord]) -> list[PlumbingScope]:
    """Connected groups of two or more plumbing ops, each one fold."""
    plumbing = {r.label: r for r in loose if is_plumbing(r)}
    group_of: dict[str, int] = {}
    groups: list[list[str]] = []
    for label, record in plumbing.items():  # execution order: parents come first
        linked = {group_of[e.label] for e in record.parents if e.label in group_of}
        if not linked:
            group_of[label] = len(groups)
            groups.append([label])
            continue
        target, *others = sorted(linked)
        for other in others:  # two chains met: merge them
            for member in groups[other]:
                group_of[member] = target
            groups[target].extend(groups[other])
            groups[other] = []
        group_of[label] = target
        groups[target].append(label)
    scopes = []
    for members in (g for g in groups if len(g) >= 2):
        ordered = sorted(members, key=lambda l: plumbing[l].op_index)
        number = len(scopes) + 1
        funcs = list(dict.fromkeys(plumbing[l].func_name.strip("_") for l in ordered))
        names = ", ".join(funcs[:3]) + (f" +{len(funcs) - 3}" if len(funcs) > 3 else "")
        scopes.append(PlumbingScope(f"index ops #{number}:1", FOLD,
                                    f"{len(ordered)} index ops ({names})", tuple(ordered)))
    return scopes
