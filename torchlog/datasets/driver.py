"""Running a model over a dataset, one model call per batch, and sending chosen sites' values to sinks.

Module addresses are captured with forward hooks on those modules (no capture mode, a plain
forward). Every other site (a layer label, a position, a torchlog.select selector) is found
once, on a logged pass of the first batch that saves nothing (the probe), as the op calls
it names (call number, output index: sites/resolve.py's `call_positions`); each batch then
runs once under the lean capture (capture/lean.py), which counts calls by the recorder's
rules and copies those outputs. A batch that runs other calls than the probe before the
last chosen one is refused: its call numbers would name other ops. With `stop_after` every
site, module addresses too, is found on the probe (which stops there) and each batch ends
right after the stop's last call.
"""
from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from torchlog.api import log_forward_pass
from torchlog.capture import ModulePass, ModuleWatcher, call_names, run_lean
from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError, closest_matches
from torchlog.history import ModelHistory, all_passes
from torchlog.model_state import model_kept
from torchlog.records import NodeKind, PassRecord
from torchlog.sites.entries import SITE_FORMS, check_site, check_stop_after
from torchlog.sites.resolve import call_positions, resolve
from torchlog.datasets.data import call_arguments

__all__ = ["Driver"]

_OPS = (NodeKind.OP, NodeKind.CREATED)


class Driver:
    """Captures the values of `sites` for one batch after another, one model call each.

    Raises:
        InvalidArgumentTypeError: when made, sites not a non-empty list of sites (or one
            site), a site of a wrong type, or a site named twice.
    """

    def __init__(self, model: nn.Module, sites: Any, stop_after: Any = None) -> None:
        self.model = model
        self.sites = check_sites(sites)
        self.stop_after = check_stop_after(stop_after)
        self._named = list(model.named_modules())
        addresses = {address for address, _ in self._named if address}
        modules = {site: _module_site(site, addresses) for site in self.sites}
        self._modules = {site: found for site, found in modules.items() if found is not None}
        # Hooks cannot end a pass early: with stop_after every site is found on the probe.
        self._hooked = {} if self.stop_after is not None else self._modules
        self._watcher = (ModuleWatcher(model, sorted({a for a, _ in self._hooked.values()}), self._named)
                         if self._hooked else None)
        self._probed = [site for site in self.sites if site not in self._hooked]
        self._positions: dict[Any, list[tuple[int, int]]] = {}  # site -> (call, output) per pass
        self._wanted: dict[int, tuple[int, ...]] = {}
        self._expected: list | None = None  # op names (and output counts) the probe called
        self._reference: list | None = None  # a batch's calls found equal to them
        self._last_call = 0  # the last call a site needs: calls after it may differ
        self._stop_call: int | None = None
        self._started = False

    def values(self, batch: Any, index: int) -> list[tuple[Any, torch.Tensor]]:
        """(site, value) for every pass each site names in batch `index`, sites in order.

        Raises:
            InvalidOptionError: on the first batch, a site that names nothing (with the
                closest names), or names no op's output; on any batch, a site that did not
                run, or a batch that ran other ops than the first before a chosen one.
            Whatever the model raises, unchanged.
        """
        args, kwargs = call_arguments(self.model, batch, index)
        if not self._started:
            self._start(args, kwargs)
        seen, lean = None, None
        with torch.no_grad(), model_kept(self._named):
            with self._watcher if self._watcher is not None else contextlib.nullcontext() as seen:
                if self._probed:
                    lean = run_lean(self.model, args, kwargs, self._wanted, named_modules=self._named,
                                    stop_call=self._stop_call)
                else:
                    self.model(*args, **kwargs)
        if lean is not None:
            self._check_calls(lean, index)
        return self._collect(seen, lean, index)

    def _start(self, args: tuple, kwargs: dict) -> None:
        """Find the probed sites' call positions on a logged pass of the first batch."""
        self._started = True
        if not self._probed:
            return
        with torch.no_grad():
            probe = log_forward_pass(self.model, list(args), kwargs, layers_to_save=None,
                                     stop_after=self.stop_after)
        passes = all_passes(probe)
        positions = call_positions(passes)
        for site in self._probed:
            records = [_op_of(passes, passes[i], site) for i in self._find(probe, passes, site)]
            self._positions[site] = [positions[r.op_index] for r in records]
            for call, output in self._positions[site]:
                self._wanted[call] = tuple(sorted(set(self._wanted.get(call, ())) | {output}))
        self._expected = _expected_calls(passes)
        self._last_call = max(self._wanted)
        if self.stop_after is not None:
            self._stop_call = max((call for call, _ in positions.values()), default=0)

    def _find(self, probe: ModelHistory, passes: list[PassRecord], site: Any) -> list[int]:
        """The op indexes of the passes `site` names in the probe, in order."""
        stopped = (f" before the pass stopped after {probe.stopped_at!r} (stop_after={self.stop_after!r})"
                   if probe.stopped_at is not None else "")
        if site in self._modules:
            address, call = self._modules[site]
            calls = probe.modules[address].call_outputs if address in probe.modules else []
            chosen = calls if call is None else calls[call - 1:call]
            labels = [outputs[0] for outputs in chosen if outputs]
            if not labels:
                raise InvalidOptionError(f"site {site!r}: module {address!r} returned no tensor on the first "
                                         f"batch{stopped}")
            by_label = {p.label: p.op_index for p in passes}
            return [by_label[label] for label in labels]
        try:
            return sorted(resolve(probe, [site]))
        except InvalidOptionError:
            near = closest_matches(str(site), probe.layer_labels + list(probe.modules))
            hint = f"; closest: {', '.join(near)}" if near else ""
            raise InvalidOptionError(
                f"site {site!r} names no layer, module or position of this model{stopped} "
                f"({len(probe.layer_labels)} layers){hint}; a site is {SITE_FORMS}") from None

    def _check_calls(self, lean: Any, index: int) -> None:
        """Refuse a batch whose calls up to the last chosen one differ from the probe's."""
        if lean.calls == self._reference:
            return
        names = call_names(lean.calls)
        expected = self._expected
        at = next((i for i, (a, b) in enumerate(zip(names, expected)) if a != b), min(len(names), len(expected)))
        if names == expected:
            self._reference = lean.calls  # compared by identity from now on: cheaper
            return
        calls_before = sum(1 for item in names[:at] if not isinstance(item, int))
        if at < len(names) and isinstance(names[at], int) or at < len(expected) and isinstance(expected[at], int):
            calls_before -= 1  # the call whose number of outputs differs
        if calls_before >= self._last_call and self._stop_call is None:
            return
        now = repr(names[at]) if at < len(names) else "nothing"
        then = repr(expected[at]) if at < len(expected) else "nothing"
        raise InvalidOptionError(
            f"batch {index} ran other ops than the first batch before a chosen site: after {calls_before} "
            f"equal calls it ran {now} where the first batch ran {then}, so its call numbers name other "
            "ops; name module addresses (found by hooks whatever runs), or give batches that run the "
            "same ops (same shapes and flags)")

    def _collect(self, seen: ModulePass | None, lean: Any, index: int) -> list[tuple[Any, torch.Tensor]]:
        found: list[tuple[Any, torch.Tensor]] = []
        for site in self.sites:
            if site in self._hooked:
                address, call = self._hooked[site]
                per_call = [outputs[0] for outputs in seen.returned[address] if outputs]
                values = per_call if call is None else per_call[call - 1:call]
            else:
                values = [lean.saved[p] for p in self._positions[site] if p in lean.saved]
                if len(values) != len(self._positions[site]):
                    values = []
            if not values:
                if site in self._hooked:
                    calls = len(seen.returned[self._hooked[site][0]])
                    why = f"module {self._hooked[site][0]!r} returned a tensor in {calls} call(s)"
                else:
                    why = "its op call did not run"
                raise InvalidOptionError(f"site {site!r} gave no value in batch {index}: {why}; every batch "
                                         "must run every chosen site")
            found += [(site, value) for value in values]
        return found


def check_sites(sites: Any) -> list[Any]:
    """The sites as a list, each checked for type, none twice.

    Raises:
        InvalidArgumentTypeError: not a site or a non-empty list of them, or a site twice.
    """
    many = list(sites) if isinstance(sites, (list, tuple)) else [sites]
    if not many:
        raise InvalidArgumentTypeError(f"sites=[] names nothing; pass one or more sites: {SITE_FORMS}")
    checked = [check_site(site, "dataset") for site in many]
    repeated = [site for i, site in enumerate(checked) if site in checked[:i]]
    if repeated:
        raise InvalidArgumentTypeError(f"site {repeated[0]!r} is named twice in sites={many!r}")
    return checked


def _module_site(site: Any, addresses: set[str]) -> tuple[str, int | None] | None:
    """(address, call number or None for every call) for a module address site ('h.0',
    'cell:3'), else None."""
    if not isinstance(site, str):
        return None
    if site in addresses:
        return site, None
    address, _, call = site.rpartition(":")
    if address in addresses and call.isdigit() and int(call) >= 1:
        return address, int(call)
    return None


def _op_of(passes: Sequence[PassRecord], record: PassRecord, site: Any) -> PassRecord:
    """The op pass whose output is `record`'s value (itself, or for a model output its op).

    Raises:
        InvalidOptionError: an input, buffer or other tensor no op call made.
    """
    if record.kind == NodeKind.OUTPUT:
        parent = record.parents[0].label
        record = next(p for p in passes if p.label == parent)
    if record.kind in _OPS and "view_written_by" not in record.extra:
        return record
    raise InvalidOptionError(
        f"site {site!r} names pass {record.label!r}, a {record.kind.value} tensor that no op call of "
        "the model made, which the lean capture cannot copy; name an op or a module instead "
        "(statistics of the inputs can be computed on the data itself)")


def _expected_calls(passes: Sequence[PassRecord]) -> list[Any]:
    """The probe's op calls as the lean capture lists them by name: each call's op name,
    followed by its number of outputs when it returned several."""
    expected: list[Any] = []
    for record in passes:
        if record.kind not in _OPS or "view_written_by" in record.extra:
            continue
        if record.output_index == 0:
            expected.append(record.func_name)
        elif record.output_index == 1:
            expected.append(2)
        else:
            expected[-1] += 1
    return expected
