"""Resolving an extract's selection on the first batch's own logged pass, then one model call per batch.

The first batch is logged once (`log_forward_pass`): its history turns the entries into
pass labels, and that batch's values come from the same call: copied by forward hooks on
the chosen modules when every entry is a module address (the log itself saves nothing),
else taken from the log, which then keeps every op's output of that one batch. Each later
batch runs once, with module hooks when every entry is a module address, else under the
lean capture, which copies the first batch's call positions and places. (A selection the
lean capture cannot find, a buffer for one, has each batch logged once instead; with a
callback that needs each batch's history, each batch is logged with `layers_to_save`,
which runs the model once where log_forward_pass can decide the entries while the pass
runs, and twice (its probe) where it cannot: docs/design.md section 4.)

A batch whose module or op sequence differs from the first batch's is not run again. For
module entries each chosen module's k-th call gives the labels its k-th call gave on the
first batch, whatever ran around it. For other entries each chosen op is taken from its
place: the n-th call of its function inside its module, counted as on the first batch
(lean.py), copied during the same call. A layer whose place did not run is missing, and
the file refuses the batch. An OpSequenceChangedWarning names the batch and the first
call that differs.

Why places, not a full log of the changed batch: a batch is known to differ only once
its call has begun, and capture cannot start in the middle of a pass (labels need every
op from the first), so a full log would mean calling the model again; logging every
batch in full in case one differs costs each batch the logger's per-op price (GPT-2 of
bench/extract_bench.py: about +10% over a plain forward, against +3% for the lean pass).
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from torchlog.api import log_forward_pass
from torchlog.arguments import positional_args
from torchlog.capture import ModuleWatcher, Place, call_names
from torchlog.errors import InvalidOptionError, OpSequenceChangedWarning
from torchlog.history import ModelHistory, all_passes
from torchlog.model_state import model_kept
from torchlog.records import NodeKind, PassRecord
from torchlog.seeding import seeded
from torchlog.sites.resolve import resolve
from torchlog.datasets.extract_runners import BatchValues, HookRunner, LeanRunner

__all__ = ["ExtractPlan"]

_LEAN_KINDS = (NodeKind.OP, NodeKind.CREATED)


class ExtractPlan:
    """Saves the selected layers of one model batch after batch, one model call each.

    `kind` is 'hooks', 'lean' or 'full' once the first batch ran ('full' when a callback
    needs each batch's history, or the selection holds buffers or other tensors no op
    returned: each batch is then logged); `num_changed` counts batches whose modules or
    ops differed from the first batch's.
    """

    def __init__(self, model: nn.Module, entries: list[str | int], needs_history: bool = False,
                 stop_after: Any = None) -> None:
        self.model = model
        self.entries = entries
        self.stop_after = stop_after  # a site as log_forward_pass takes it: each batch ends there
        self.kind: str | None = None
        self.labels: list[str] = []
        # Each entry with the labels it selected on the first batch, in execution order.
        self.selected: list[tuple[str | int, list[str]]] = []
        self.num_changed = 0
        self._needs_history = needs_history
        self._named = list(model.named_modules())
        self._runner: HookRunner | LeanRunner | None = None
        self._expected: list | None = None  # the op names the first lean batch must call
        self._reference: list | None = None  # the first batch's module or op sequence

    def save(self, batch: Any, seed: int, index: int) -> tuple[dict[str, torch.Tensor], ModelHistory | None]:
        """The selected layers' values for one batch by label, in execution order (a label
        whose op did not run in this batch is left out), and the batch's history when it
        was logged (None otherwise). The model is called once.

        Raises:
            InvalidOptionError: on the first batch, an entry that selects nothing.
            Whatever the model raises, unchanged.
        """
        with torch.no_grad():
            if self.kind is None:
                return self._start(batch, seed)
            if self.kind == "full":
                return self._full(batch, seed)
            with seeded(seed), model_kept(self._named):
                seen = self._runner.run(self.model, positional_args(self.model, batch), {})
            if seen.sequence == self._reference:
                return seen.by_call, None
            if self._reference is None and call_names(seen.sequence) == self._expected:
                self._reference = seen.sequence  # compared by identity from now on: cheaper
                return seen.by_call, None
            self._warn(index, seen)
            return seen.by_place, None

    def _start(self, batch: Any, seed: int) -> tuple[dict[str, torch.Tensor], ModelHistory | None]:
        """Log the first batch once; resolve the entries on it; its values from that pass."""
        addresses = dict(self._named)
        stop = self.stop_after
        if self._needs_history:
            history = log_forward_pass(self.model, batch, layers_to_save=self.entries, random_seed=seed,
                                       keep_unsaved_layers=True, stop_after=stop)
            self._resolve(history)
            self.kind = "full"
            return self._values(history, self.labels), history
        # Hooks cannot end a pass at an op; with stop_after every batch runs lean (or logged).
        if stop is None and all(isinstance(e, str) and e in addresses for e in self.entries):
            watcher = ModuleWatcher(self.model, self.entries, self._named)
            with watcher as seen:
                history = log_forward_pass(self.model, batch, layers_to_save=None, random_seed=seed)
            self._resolve(history)
            self._runner = HookRunner(watcher, {e: history.modules[e].call_outputs for e in self.entries},
                                      self.labels)
            self._reference, self.kind = seen.calls, "hooks"
            return self._runner.values(seen), None
        history = log_forward_pass(self.model, batch, layers_to_save="all", random_seed=seed, stop_after=stop)
        chosen = self._resolve(history)
        if all(_lean_kind(p) is not None for p in chosen):
            self._runner, self._expected = _lean_runner(all_passes(history), chosen, self.labels, self._named,
                                                        stop=stop is not None)
            self.kind = "lean"
        else:
            self.kind = "full"
        return self._values(history, self.labels), None

    def _resolve(self, history: ModelHistory) -> list[PassRecord]:
        """Note the labels each entry selects in `history`; return the chosen passes."""
        passes = all_passes(history)
        # One entry at a time, so that the file can say which entry chose which layer.
        per_entry = [self._resolve_entry(history, entry) for entry in self.entries]
        self.selected = [(entry, [passes[i].label for i in sorted(found)])
                         for entry, found in zip(self.entries, per_entry)]
        chosen = [passes[i] for i in sorted(set().union(*per_entry))]
        self.labels = [p.label for p in chosen]
        return chosen

    def _resolve_entry(self, history: ModelHistory, entry: str | int) -> set[int]:
        try:
            return resolve(history, [entry])
        except InvalidOptionError as exc:
            if history.stopped_at is None:
                raise
            raise InvalidOptionError(
                f"{exc}; the pass stopped after {history.stopped_at!r} (stop_after={self.stop_after!r}), so "
                f"layers that run later are not reached: move stop_after past {entry!r} or leave it out"
            ) from None

    def _full(self, batch: Any, seed: int) -> tuple[dict[str, torch.Tensor], ModelHistory | None]:
        """Log the batch and resolve the entries on its own history, as log_forward_pass does."""
        if self._needs_history:
            history = log_forward_pass(self.model, batch, layers_to_save=self.entries, random_seed=seed,
                                       keep_unsaved_layers=True, stop_after=self.stop_after)
        else:  # one call: every value kept by reference, the chosen ones taken
            history = log_forward_pass(self.model, batch, layers_to_save="all", random_seed=seed,
                                       stop_after=self.stop_after)
        passes = all_passes(history)
        labels = [passes[i].label for i in sorted(resolve(history, self.entries))]
        return self._values(history, labels), history if self._needs_history else None

    @staticmethod
    def _values(history: ModelHistory, labels: list[str]) -> dict[str, torch.Tensor]:
        passes = {p.label: p for p in all_passes(history)}
        return {label: passes[label].tensor_contents for label in labels}

    def _warn(self, index: int, seen: BatchValues) -> None:
        self.num_changed += 1
        missing = [label for label in self.labels if label not in seen.by_place]
        if self.kind == "hooks":
            how = "each chosen module's outputs were saved under the labels of its calls on the first batch"
        else:
            how = ("each chosen op was saved from this same call at its place on the first batch (the "
                   "n-th call of its function inside its module), under its first-batch label")
        lost = f"; not run in this batch: {', '.join(missing)}" if missing else ""
        warnings.warn(f"batch {index} ran other {'modules' if self.kind == 'hooks' else 'ops'} than the "
                      f"first batch ({_difference(self, seen.sequence)}); {how}{lost}",
                      OpSequenceChangedWarning, stacklevel=4)


def _lean_kind(record: PassRecord) -> str | None:
    """How a lean pass finds this pass's value: 'op', 'input', 'output', or None (it cannot)."""
    if record.kind in _LEAN_KINDS and "view_written_by" not in record.extra:
        return "op"
    return {NodeKind.INPUT: "input", NodeKind.OUTPUT: "output"}.get(record.kind)


def _lean_runner(passes: Sequence[PassRecord], chosen: Sequence[PassRecord], labels: list[str],
                 named_modules: list, stop: bool = False) -> tuple[LeanRunner, list]:
    """The runner saving `chosen` at their call positions and places, and the calls it must
    see; with `stop` (`passes` end where stop_after ended the pass), it ends each pass after
    the last call they hold."""
    positions: dict[int, tuple[int, int]] = {}
    places: dict[int, tuple[Place, int]] = {}
    num_at: dict[tuple[str, str], int] = {}
    expected: list = []
    count = 0
    for record in passes:
        if _lean_kind(record) != "op":
            continue
        if record.output_index == 0:
            count += 1
            expected.append(record.func_name)
            scope = (record.func_name, _module_of(record))
            num_at[scope] = num_at.get(scope, 0) + 1
            place = (*scope, num_at[scope])
        elif record.output_index == 1:
            expected.append(2)
        else:
            expected[-1] += 1
        positions[record.op_index] = (count, record.output_index)
        places[record.op_index] = (place, record.output_index)
    inputs = [r.op_index for r in passes if r.kind == NodeKind.INPUT]
    outputs = [r.op_index for r in passes if r.kind == NodeKind.OUTPUT]
    kinds = {r.label: _lean_kind(r) for r in chosen}
    ops = [r for r in chosen if kinds[r.label] == "op"]
    return LeanRunner(
        {r.label: positions[r.op_index] for r in ops}, {r.label: places[r.op_index] for r in ops},
        {r.label: inputs.index(r.op_index) for r in chosen if kinds[r.label] == "input"},
        {r.label: outputs.index(r.op_index) for r in chosen if kinds[r.label] == "output"},
        labels, named_modules, stop_call=count if stop else None), expected


def _module_of(record: PassRecord) -> str:
    """The address of the innermost module running the op ('' for the model's own forward)."""
    return record.containing_modules[0].rpartition(":")[0] if record.containing_modules else ""


def _difference(plan: ExtractPlan, sequence: list) -> str:
    """Where `sequence` first leaves the first batch's, in words."""
    if plan.kind == "hooks":
        named = {id(m): a or "(the model)" for a, m in plan._named}
        sequence, reference = [named.get(i, "?") for i in sequence], [named.get(i, "?") for i in plan._reference]
        unit = "module call"
    else:
        sequence = call_names(sequence)
        reference = plan._expected if plan._reference is None else call_names(plan._reference)
        unit = "call"

    def word(item: Any) -> str:
        return f"{item} outputs" if isinstance(item, int) else repr(item)

    at = next((i for i, (a, b) in enumerate(zip(sequence, reference)) if a != b),
              min(len(sequence), len(reference)))
    now = word(sequence[at]) if at < len(sequence) else "nothing"
    then = word(reference[at]) if at < len(reference) else "nothing"
    return (f"{unit} {at + 1} is {now} where the first batch had {then}; {len(sequence)} "
            f"{unit}s now, {len(reference)} then")
