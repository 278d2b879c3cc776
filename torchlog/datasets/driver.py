"""Running a model over a dataset, one model call per batch, and handing on chosen sites' values.

Module addresses are captured with forward hooks on those modules (no capture mode, a plain
forward). Every other site (a layer label, a position, a torchlog.select selector) is found
on a logged pass of the first batch (the probe, which also gives that batch's values, so
the first batch is one call too) as the op calls it names (site_passes.py); each later
batch then runs once under the lean capture (capture/lean.py), which counts calls by the
recorder's rules and copies those outputs. A pass the lean capture cannot reach (a buffer)
has every batch logged. With `stop_after` every site, module addresses too, is found on the
probe (which stops there) and each batch ends right after the stop's last call.

A batch that runs other calls than the probe before the last chosen one is refused: its
call numbers would name other ops. `DriverOptions(changed_ops='by_place')` saves it instead
from the same call, each op at its first-batch place, with an OpSequenceChangedWarning.
"""
from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from torchlog.api import log_forward_pass
from torchlog.capture import ModulePass, ModuleWatcher, call_names, find_tensors, run_lean
from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError, OpSequenceChangedWarning
from torchlog.history import ModelHistory, all_passes
from torchlog.model_state import model_kept
from torchlog.seeding import seeded
from torchlog.sites.entries import SITE_FORMS, check_site, check_stop_after
from torchlog.datasets.data import call_arguments
from torchlog.datasets.site_passes import Selection, select

__all__ = ["Driver", "DriverOptions", "check_sites"]

_CHANGED = ("error", "by_place")


@dataclass(frozen=True, slots=True)
class DriverOptions:
    """How a Driver runs each batch, beyond its sites and stop.

    Raises:
        InvalidOptionError: changed_ops not 'error' or 'by_place'.
        InvalidArgumentTypeError: seed not None or an int.
    """

    every_output: bool = False  # a module site names every tensor it returns, not each call's first
    seed: int | None = None  # batch i runs with the RNGs seeded to seed + i (None: left alone)
    changed_ops: str = "error"  # a batch whose ops changed before a site: 'error', or 'by_place'

    def __post_init__(self) -> None:
        if self.changed_ops not in _CHANGED:
            raise InvalidOptionError(f"changed_ops must be 'error' (refuse a batch whose ops changed before a "
                                     f"site) or 'by_place', got {self.changed_ops!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise InvalidArgumentTypeError(f"seed must be None or an int, got {self.seed!r}")


class Driver:
    """Captures the values of `sites` for one batch after another, one model call each.

    After the first batch, `selection` holds each site's passes on it (by label) and
    `kind` says how batches run: 'hooks' (module hooks alone, no probe), 'lean', or
    'logged'.

    Raises:
        InvalidArgumentTypeError: when made, sites not a non-empty list of sites (or one
            site), a site of a wrong type, or a site named twice.
    """

    def __init__(self, model: nn.Module, sites: Any, stop_after: Any = None,
                 options: DriverOptions | None = None) -> None:
        self.model = model
        self.sites = check_sites(sites)
        self.stop_after = check_stop_after(stop_after)
        self.options = options or DriverOptions()
        self._named = list(model.named_modules())
        addresses = {address for address, _ in self._named if address}
        modules = {site: _module_site(site, addresses) for site in self.sites}
        self._modules = {site: found for site, found in modules.items() if found is not None}
        # Hooks cannot end a pass early: with stop_after every site is found on the probe.
        self._hooked = {} if self.stop_after is not None else self._modules
        self._watcher = (ModuleWatcher(model, sorted({a for a, _ in self._hooked.values()}), self._named)
                         if self._hooked else None)
        self.selection: Selection | None = None
        self.kind: str | None = None
        self._reference: list | None = None  # a batch's calls found equal to the probe's

    def values(self, batch: Any, index: int) -> list[tuple[Any, torch.Tensor]]:
        """(site, value) for every pass each site names in batch `index`, sites in order.

        Raises:
            InvalidOptionError: on the first batch, a site that names nothing (with the
                closest names); on any batch, a site that did not run, or a batch that
                ran other ops than the first before a chosen one (with changed_ops='error').
            Whatever the model raises, unchanged.
        """
        return [(site, value) for site, found in self._capture(batch, index).items() for value in found]

    def by_label(self, batch: Any, index: int) -> dict[str, torch.Tensor]:
        """Batch `index`'s values by their first-batch label, each pass once, in execution
        order (`selection.order`). Raises as `values` does."""
        found = self._capture(batch, index)
        if self.selection is None:
            raise InvalidOptionError("by_label needs the first batch's labels: make the Driver with "
                                     "DriverOptions(every_output=True) or a site that is no module address")
        values: dict[str, torch.Tensor] = {}
        for site, chosen in self.selection.per_site.items():
            values.update((c.label, value) for c, value in zip(chosen, found[site]))
        return {label: values[label] for label in self.selection.order}

    def _capture(self, batch: Any, index: int) -> dict[Any, list[torch.Tensor]]:
        args, kwargs = call_arguments(self.model, batch, index)
        if self.kind is None:
            return self._start(args, kwargs, index)
        if self.kind == "logged":
            return self._logged(args, kwargs, index)
        seen, lean = None, None
        places = self.selection.places if self.selection and self.options.changed_ops == "by_place" else None
        with torch.no_grad(), model_kept(self._named), self._seeded(index):
            with self._watcher if self._watcher is not None else contextlib.nullcontext() as seen:
                if self.kind == "lean":
                    lean = run_lean(self.model, args, kwargs, self.selection.wanted, places,
                                    named_modules=self._named, stop_call=self._stop_call)
                else:
                    self.model(*args, **kwargs)
        by_place = lean is not None and not self._same_calls(lean, index)
        return {site: self._found(site, seen, lean, args, kwargs, index, by_place) for site in self.sites}

    @property
    def _stop_call(self) -> int | None:
        return self.selection.num_calls if self.stop_after is not None else None

    def _seeded(self, index: int) -> Any:
        return seeded(self.options.seed + index) if self.options.seed is not None else contextlib.nullcontext()

    def _start(self, args: tuple, kwargs: dict, index: int) -> dict[Any, list[torch.Tensor]]:
        """Run the first batch: with hooks alone when every site is a hooked module and no
        label is needed, else logged once (the probe), finding every site's passes."""
        options = self.options
        if len(self._hooked) == len(self.sites) and not options.every_output:
            self.kind = "hooks"
            return self._run_hooks(args, kwargs, index)
        seed = None if options.seed is None else options.seed + index
        hooked = self._hooked
        watcher = self._watcher if hooked else None
        # Every site hooked: the hooks give the values, the log only finds the labels.
        keep = "all" if len(hooked) < len(self.sites) else None
        with torch.no_grad(), watcher if watcher is not None else contextlib.nullcontext() as seen:
            probe = self._log(args, kwargs, seed, keep)
        self.selection = select(probe, self.sites, self._modules, list(hooked), options.every_output,
                                self.stop_after)
        hows = {c.how for chosen in self.selection.per_site.values() for c in chosen}
        if "logged" in hows:
            self.kind = "logged"
        else:  # only the lean capture can end a pass at stop_after
            self.kind = "lean" if "op" in hows or self.stop_after is not None else "hooks"
        if self.kind == "logged":
            self._watcher = None
        contents = {p.label: p.tensor_contents for p in all_passes(probe)}
        return {site: [seen.returned[c.key[0]][c.key[1]][c.key[2]] if c.how == "hook" else contents[c.label]
                       for c in chosen] for site, chosen in self.selection.per_site.items()}

    def _run_hooks(self, args: tuple, kwargs: dict, index: int) -> dict[Any, list[torch.Tensor]]:
        with torch.no_grad(), model_kept(self._named), self._seeded(index), self._watcher as seen:
            self.model(*args, **kwargs)
        return {site: self._found(site, seen, None, args, kwargs, index, False) for site in self.sites}

    def _log(self, args: tuple, kwargs: dict, seed: int | None, keep: str | None = "all") -> ModelHistory:
        """One logged pass of a batch, the outputs `keep` names kept (by reference)."""
        return log_forward_pass(self.model, list(args), kwargs, layers_to_save=keep, random_seed=seed,
                                stop_after=self.stop_after)

    def _logged(self, args: tuple, kwargs: dict, index: int) -> dict[Any, list[torch.Tensor]]:
        """Log the batch; its sites' passes must be the first batch's, by label."""
        with torch.no_grad():
            history = self._log(args, kwargs, None if self.options.seed is None else self.options.seed + index)
        now = select(history, self.sites, self._modules, [], self.options.every_output, self.stop_after)
        for site in self.sites:
            labels = [c.label for c in now.per_site[site]]
            first = [c.label for c in self.selection.per_site[site]]
            if labels != first:
                raise InvalidOptionError(
                    f"batch {index} ran other ops than the first batch: site {site!r} names {labels} in it but "
                    f"{first} in the first batch; give batches that run the same ops (same shapes and flags)")
        contents = {p.label: p.tensor_contents for p in all_passes(history)}
        return {site: [contents[c.label] for c in chosen] for site, chosen in now.per_site.items()}

    def _same_calls(self, lean: Any, index: int) -> bool:
        """Whether the batch's calls up to the last chosen one are the probe's; raise
        (changed_ops='error') or warn ('by_place') when they are not."""
        if lean.calls == self._reference:
            return True
        names, expected = call_names(lean.calls), self.selection.expected
        if names == expected:
            self._reference = lean.calls  # compared by identity from now on: cheaper
            return True
        at = next((i for i, (a, b) in enumerate(zip(names, expected)) if a != b), min(len(names), len(expected)))
        calls_before = sum(1 for item in names[:at] if not isinstance(item, int))
        if at < len(names) and isinstance(names[at], int) or at < len(expected) and isinstance(expected[at], int):
            calls_before -= 1  # the call whose number of outputs differs
        if calls_before >= self.selection.last_call and self.stop_after is None:
            return True
        now = repr(names[at]) if at < len(names) else "nothing"
        then = repr(expected[at]) if at < len(expected) else "nothing"
        if self.options.changed_ops == "by_place":
            warnings.warn(f"batch {index} ran other ops than the first batch before a chosen site: after "
                          f"{calls_before} equal calls it ran {now} where the first batch ran {then}; each chosen "
                          "op was saved from this same call at its place on the first batch (the n-th call of its "
                          "function inside its module)", OpSequenceChangedWarning, stacklevel=4)
            return False
        raise InvalidOptionError(
            f"batch {index} ran other ops than the first batch before a chosen site: after {calls_before} "
            f"equal calls it ran {now} where the first batch ran {then}, so its call numbers name other "
            "ops; name module addresses (found by hooks whatever runs), give batches that run the same ops "
            "(same shapes and flags), or save each op from its place (changed_ops='by_place')")

    def _found(self, site: Any, seen: ModulePass | None, lean: Any, args: tuple, kwargs: dict, index: int,
               by_place: bool) -> list[torch.Tensor]:
        """The site's values in this batch, each pass found as the selection says."""
        if site in self._hooked and (self.selection is None or not self.options.every_output):
            address, call = self._hooked[site]
            per_call = [outputs[0] for outputs in seen.returned[address] if outputs]
            values = per_call if call is None else per_call[call - 1:call]
            if values:
                return values
            raise InvalidOptionError(
                f"site {site!r} gave no value in batch {index}: module {address!r} returned a tensor in "
                f"{len(seen.returned[address])} call(s); every batch must run every chosen site")
        chosen = self.selection.per_site[site]
        if site in self._hooked:
            self._check_module_calls(site, seen, index)
        given = None
        values = []
        for c in chosen:
            if c.how == "hook":
                address, call, tensor = c.key
                value = seen.returned[address][call][tensor]
            elif c.how == "op":
                value = (lean.at_places if by_place else lean.saved).get(c.place if by_place else c.key)
            else:
                if given is None:  # forward's distinct input tensors, numbered as capture numbers them
                    given = list({id(t): t for t, _ in find_tensors((args, kwargs))}.values())
                value = given[c.key].detach().clone() if c.key < len(given) else None
            if value is None:
                raise InvalidOptionError(f"site {site!r} gave no value in batch {index}: {c.label!r} (its op "
                                         "call on the first batch) did not run; every batch must run every "
                                         "chosen site")
            values.append(value)
        return values

    def _check_module_calls(self, site: Any, seen: ModulePass, index: int) -> None:
        """A hooked module site with every output: each call the first batch made must run,
        and with changed_ops='error' no other."""
        address, call = self._hooked[site]
        num_first = max(c.key[1] for c in self.selection.per_site[site]) + 1
        num_now = len(seen.returned[address])
        if num_now == num_first or call is not None and num_now > num_first:
            return
        why = (f"module {address!r} was called {num_now} time(s) in batch {index}, {num_first} time(s) in the "
               "first batch")
        if num_now > num_first and self.options.changed_ops == "by_place":
            warnings.warn(f"{why}; site {site!r} saved its first {num_first} call(s)", OpSequenceChangedWarning,
                          stacklevel=5)
            return
        raise InvalidOptionError(f"site {site!r}: {why}; give batches that run the same modules, or name one "
                                 f"call ({address + ':1'!r})")


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
