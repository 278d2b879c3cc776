"""Resolving an extract's layer selection once, on the first batch, into the cheapest way to save it.

The first batch runs one logged pass without saving (the probe, on its first sample
only when the model runs the same ops on one sample) to turn the entries into pass labels. Later batches then run with module hooks when every entry is a module
address, else with the lean capture, which saves at the probe's call positions. Each
batch's module or op sequence is compared with the first batch's: a batch that differs
runs the full logged path (`log_forward_pass` with `layers_to_save`) instead, with an
OpSequenceChangedWarning saying where, so nothing is saved from the wrong op.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from torchlog.api import log_forward_pass
from torchlog.arguments import positional_args
from torchlog.capture.call_sites import name_of
from torchlog.capture.lean import call_names
from torchlog.errors import InvalidArgumentTypeError, OpSequenceChangedWarning
from torchlog.history import ModelHistory, all_passes
from torchlog.model_state import model_kept
from torchlog.records import NodeKind, PassRecord
from torchlog.seeding import seeded
from torchlog.selection import resolve
from torchlog.storage.batches import batch_len
from torchlog.storage.extract_runners import HookRunner, LeanRunner

__all__ = ["ExtractPlan"]

_LEAN_KINDS = (NodeKind.OP, NodeKind.CREATED)


class ExtractPlan:
    """Saves the selected layers of one model batch after batch, as cheaply as it can.

    `kind` is 'hooks', 'lean' or 'full' once the first batch ran ('full' when a
    callback needs each batch's history, or the selection holds buffers or other
    tensors no op returned); `num_fallbacks` counts batches that ran the full path.
    """

    def __init__(self, model: nn.Module, entries: list[str | int], needs_history: bool = False) -> None:
        self.model = model
        self.entries = entries
        self.kind: str | None = None
        self._needs_history = needs_history
        self.labels: list[str] = []
        # Each entry with the labels it selected on the first batch, in execution order.
        self.selected: list[tuple[str | int, list[str]]] = []
        self.num_fallbacks = 0
        self._named = list(model.named_modules())
        self._runner: HookRunner | LeanRunner | None = None
        self._outputs: dict[str, tuple] = {}  # hooks: module address -> labels per call
        self._expected: list | None = None  # the op names the first lean pass must see
        self._reference: list | None = None  # the first batch's module or op sequence
        self._kept_outputs: frozenset[int] = frozenset()  # positions of the selected outputs

    def save(self, batch: Any, seed: int, index: int) -> tuple[dict[str, torch.Tensor], ModelHistory | None]:
        """The selected layers' values for one batch by label, in execution order, and the
        batch's history when the full path ran (None otherwise).

        Raises:
            InvalidOptionError: on the first batch, an entry that selects nothing.
            Whatever the model raises, unchanged.
        """
        with torch.no_grad():
            if self.kind is None:
                return self._start(batch, seed)
            if self.kind == "full":
                return self._full(batch, seed)
            values, sequence = self._fast(batch, seed)
            if values is not None and sequence == self._reference:
                return values, None
            self._warn(index, sequence)
            return self._full(batch, seed)

    def _start(self, batch: Any, seed: int) -> tuple[dict[str, torch.Tensor], ModelHistory | None]:
        """Resolve the entries on the first sample (a cheap logged pass), then run the first
        batch fast and keep its sequence; if that pass saw other calls than the probe (a
        model whose ops depend on the batch size), resolve again on the whole batch."""
        one = _first_sample(batch)
        for probe in ([one] if one is not None else []) + [batch]:
            try:
                self._resolve(probe, seed)
            except Exception:
                if probe is batch:
                    raise
                continue  # e.g. a model that cannot run one sample: probe the whole batch
            if self.kind == "full":
                return self._full(batch, seed)
            values, sequence = self._fast(batch, seed)
            if values is not None and (self.kind == "hooks" or call_names(sequence) == self._expected):
                self._reference = sequence
                return values, None
        warnings.warn(
            f"the {self.kind} pass over the first batch did not see the "
            f"{'module calls' if self.kind == 'hooks' else 'ops'} the logged pass saw, so "
            "every batch runs the full logged path; the model may run other ops on each call",
            OpSequenceChangedWarning, stacklevel=4)
        self.kind = "full"
        return self._full(batch, seed)

    def _fast(self, batch: Any, seed: int) -> tuple[dict[str, torch.Tensor] | None, list]:
        with seeded(seed), model_kept(self._named):
            return self._runner.run(self.model, positional_args(self.model, batch), {})

    def _resolve(self, batch: Any, seed: int) -> None:
        probe = log_forward_pass(self.model, batch, layers_to_save=None, random_seed=seed)
        passes = all_passes(probe)
        # One entry at a time, so that the file can say which entry chose which layer.
        per_entry = [resolve(probe, [entry]) for entry in self.entries]
        indexes = set().union(*per_entry)
        self.selected = [(entry, [passes[i].label for i in sorted(found)])
                         for entry, found in zip(self.entries, per_entry)]
        chosen = [passes[i] for i in sorted(indexes)]
        self.labels = [p.label for p in chosen]
        outputs = [p for p in passes if p.kind == NodeKind.OUTPUT]
        self._kept_outputs = frozenset(k for k, p in enumerate(outputs) if p.op_index in indexes)
        if self._needs_history:
            self.kind = "full"
        elif all(isinstance(e, str) and e in probe.modules for e in self.entries):
            self._outputs = {e: probe.modules[e].call_outputs for e in self.entries}
            self._runner = HookRunner(self.model, self._outputs, self.labels)
            self.kind = "hooks"
        elif all(_lean_kind(p) is not None for p in chosen):
            self._runner, self._expected = _lean_runner(passes, chosen, self.labels)
            self.kind = "lean"
        else:
            self.kind = "full"

    def _full(self, batch: Any, seed: int) -> tuple[dict[str, torch.Tensor], ModelHistory]:
        history = log_forward_pass(self.model, batch, layers_to_save=self.entries, random_seed=seed)
        if self.kind != "hooks":
            # log_forward_pass also keeps every output; an extract saves only the selection.
            outputs = history.output_layers
            dropped = {label for k, label in enumerate(outputs) if k not in self._kept_outputs}
            return {p.label: p.tensor_contents for p in history
                    if p.saved is not None and p.label not in dropped}, history
        # Ops outside the modules may have renumbered the labels of this batch: a module's
        # output keeps the label the first batch gave it (a call it did not make is missing).
        found: dict[str, torch.Tensor] = {}
        for address, first_calls in self._outputs.items():
            for first, now in zip(first_calls, history.modules[address].call_outputs):
                for label, current in zip(first, now):
                    found.setdefault(label, history[current].tensor_contents)
        return {label: found[label] for label in self.labels if label in found}, history

    def _warn(self, index: int, sequence: list) -> None:
        self.num_fallbacks += 1
        what = "modules" if self.kind == "hooks" else "ops"
        warnings.warn(
            f"batch {index} ran other {what} than the first batch ({_difference(self, sequence)}); "
            "this batch was saved through the full logged path, which finds the selected "
            "layers by label, so no value comes from another op",
            OpSequenceChangedWarning, stacklevel=4)


def _first_sample(batch: Any) -> Any:
    """The batch cut to its first sample (every tensor whose first axis is the batch's), or
    None when it holds one sample already or no tensor with a sample axis."""
    try:
        size = batch_len(batch)
    except InvalidArgumentTypeError:
        return None
    if size <= 1:
        return None

    def cut(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value[:1] if value.dim() and value.shape[0] == size else value
        if isinstance(value, (list, tuple)):
            return type(value)(cut(v) for v in value)
        if isinstance(value, dict):
            return {k: cut(v) for k, v in value.items()}
        return value

    return cut(batch)


def _lean_kind(record: PassRecord) -> str | None:
    """How a lean pass finds this pass's value: 'op', 'input', 'output', or None (it cannot)."""
    if record.kind in _LEAN_KINDS and "view_written_by" not in record.extra:
        return "op"
    return {NodeKind.INPUT: "input", NodeKind.OUTPUT: "output"}.get(record.kind)


def _lean_runner(passes: Sequence[PassRecord], chosen: Sequence[PassRecord],
                 labels: list[str]) -> tuple[LeanRunner, list]:
    """The runner saving `chosen` at their call positions, and the calls it must see."""
    positions: dict[int, tuple[int, int]] = {}
    expected: list = []
    count = 0
    for record in passes:
        if _lean_kind(record) != "op":
            continue
        if record.output_index == 0:
            count += 1
            expected.append(record.func_name)
        elif record.output_index == 1:
            expected.append(2)
        else:
            expected[-1] += 1
        positions[record.op_index] = (count, record.output_index)
    inputs = [r.op_index for r in passes if r.kind == NodeKind.INPUT]
    outputs = [r.op_index for r in passes if r.kind == NodeKind.OUTPUT]
    kinds = {r.label: _lean_kind(r) for r in chosen}
    return LeanRunner(
        {r.label: positions[r.op_index] for r in chosen if kinds[r.label] == "op"},
        {r.label: inputs.index(r.op_index) for r in chosen if kinds[r.label] == "input"},
        {r.label: outputs.index(r.op_index) for r in chosen if kinds[r.label] == "output"},
        labels), expected


def _difference(plan: ExtractPlan, sequence: list) -> str:
    """Where `sequence` first leaves the first batch's, in words."""
    reference = plan._reference or []
    named = {id(m): a or "(the model)" for a, m in plan._named}

    def word(item: Any) -> str:
        if plan.kind == "hooks":
            return repr(named.get(item, "?"))
        return f"{item} outputs" if isinstance(item, int) else repr(name_of(item))

    at = next((i for i, (a, b) in enumerate(zip(sequence, reference)) if a is not b and a != b),
              min(len(sequence), len(reference)))
    now = word(sequence[at]) if at < len(sequence) else "nothing"
    then = word(reference[at]) if at < len(reference) else "nothing"
    unit = "module call" if plan.kind == "hooks" else "call"
    return (f"{unit} {at + 1} is {now} where the first batch had {then}; {len(sequence)} "
            f"{unit}s now, {len(reference)} then")
