"""Ops that build masks and positions, grouped so they do not crowd the view.

A transformer builds its causal mask and position ids in helper functions and in its forwards,
beside the modules that do the work (about 25 of GPT-2's first 59 nodes), so no depth
setting hides them. What marks them is what they do, not where: none of them reads the
model's data. An op *carries data* when it uses a parameter, is a floating-point model
input, or reads a value that carries data; the others (positions, masks, constants) are
plumbing candidates. Within each scope (the top level, or one module or functional call,
at any depth) the page puts them in scopes of their own, drawn collapsed like a module until
opened (or until "show plumbing" is ticked):

- a *helper* scope: a run of consecutive ops of one scope that carry no data and whose call
  site is a function other than a `forward` (`masking_utils.py` in `sdpa_mask`,
  `eager_mask`, ...), one scope per run, named by the file (`masking_utils:1`);
- a *fold*: a connected chain of two or more index, view, mask and integer ops of one
  scope that carry no data (`arange -> add -> unsqueeze` of position ids), drawn as one node
  `3 index ops`.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
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


def plumbing_scopes(history: "ModelHistory", scopes: Mapping[str, tuple[str, ...]]) -> list[PlumbingScope]:
    """The helper runs and folds of `history`'s ops that carry no data, in every scope.

    `scopes` holds each pass's module and functional calls, innermost first; a helper run or
    fold holds ops of one innermost call (or of none: the top level) only.
    """
    inner = {label: chain[0] if chain else None for label, chain in scopes.items()}
    free = _carry_no_data(history)
    helpers = _helper_runs(history, inner, free)
    in_helper = {label for scope in helpers for label in scope.members}
    folds = _folds([r for r in history if r.label in free and r.label not in in_helper], inner)
    return helpers + folds


def _carry_no_data(history: "ModelHistory") -> set[str]:
    """Labels of the ops that use no parameter and read nothing derived from one or from a
    floating-point model input (positions, masks, constants), model inputs and outputs aside."""
    carries: set[str] = set()
    free: set[str] = set()
    for record in history:  # execution order: parents come first
        is_data_input = record.kind is NodeKind.INPUT and (record.dtype.is_floating_point or record.dtype.is_complex)
        if is_data_input or record.params or any(e.label in carries for e in record.parents):
            carries.add(record.label)
        elif record.kind not in _OUTSIDE:
            free.add(record.label)
    return free


def _site(record: PassRecord) -> tuple[str, str] | None:
    match = _SITE.match(record.call_site or "")
    return (match["file"], match["func"]) if match else None


def _helper_runs(history: "ModelHistory", inner: Mapping[str, str | None],
                 free: set[str]) -> list[PlumbingScope]:
    """Consecutive ops of one scope that carry no data, from one file's functions other
    than `forward`."""
    runs: list[tuple[str, list[PassRecord]]] = []
    current: tuple[tuple[str | None, str], list[PassRecord]] | None = None
    for record in history:
        if record.kind in _OUTSIDE:
            continue
        site = _site(record) if record.label in free else None
        if site is None or site[1] == "forward" or site[1].startswith("<"):
            current = None  # a module's op, a forward's own op or one carrying data ends a run
            continue
        key = (inner[record.label], PurePath(site[0]).stem)
        if current is None or current[0] != key:
            current = (key, [])
            runs.append((key[1], current[1]))
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


def _folds(candidates: list[PassRecord], inner: Mapping[str, str | None]) -> list[PlumbingScope]:
    """Connected groups of two or more plumbing ops of one scope, each one fold."""
    plumbing = {r.label: r for r in candidates if is_plumbing(r)}
    group_of: dict[str, int] = {}
    groups: list[list[str]] = []
    for label, record in plumbing.items():  # execution order: parents come first
        linked = {group_of[e.label] for e in record.parents
                  if e.label in group_of and inner[e.label] == inner[label]}
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
