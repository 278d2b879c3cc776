"""From the user's `intervene` and `stop_after` to the plan capture acts on (capture/plan.py).

Sites are checked when the options are made, resolved once per call: module addresses and
selectors that can be decided while the pass runs become rules of the plan directly; labels,
positions, substrings and mixed selectors are resolved on a logged pass first (the probe,
the same pass `layers_to_save` resolves on, through `torchlog.selection.resolve`), and become
positions the intervened pass must reach running the same ops.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchlog.capture.plan import Act, ExitRule, OpPlan, OpRule
from torchlog.errors import (InterventionError, InvalidArgumentTypeError, InvalidOptionError,
                             closest_matches)
from torchlog.history import ModelHistory, all_passes
from torchlog.interventions.actions import Action, as_action
from torchlog.records import NodeKind, PassRecord
from torchlog.select import Selector, _InModule, _Module, _ModuleType
from torchlog.selection import call_positions, resolve

__all__ = ["Interventions", "Site", "acted_on", "check_intervene", "check_stop_after", "exit_part"]

_SITE_FORMS = ("a layer label ('relu_1_2', 'linear_1_1:2'), a module address ('features.6', "
               "'cell:3'), an int position (-5), or a torchlog.select selector "
               "(select.func('softmax') & select.in_module('h.1'))")


@dataclass(frozen=True, slots=True)
class Site:
    """One (site, action) pair of `intervene`, checked."""

    number: int  # its position in `intervene`
    given: Any  # the site as the user wrote it
    action: Action


def check_intervene(intervene: Any) -> tuple[Site, ...]:
    """The (site, action) pairs of `intervene` (a dict, or a list of pairs), in order, checked
    for type; () for None.

    Raises:
        InvalidArgumentTypeError: not a dict or list of pairs, a site or action of a wrong type.
        InvalidOptionError: an empty dict or list.
    """
    if intervene is None:
        return ()
    if isinstance(intervene, Mapping):
        pairs = list(intervene.items())
    elif isinstance(intervene, (list, tuple)):
        pairs = list(intervene)
        for pair in pairs:
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise InvalidArgumentTypeError(
                    f"intervene as a list takes (site, action) pairs, got {pair!r}; or pass a dict "
                    "{site: action}")
    else:
        raise InvalidArgumentTypeError(
            f"intervene must be a dict {{site: action}} or a list of (site, action) pairs, got "
            f"{intervene!r} of type {type(intervene).__name__}")
    if not pairs:
        raise InvalidOptionError("intervene is empty; pass None for no interventions, or {site: action}")
    return tuple(Site(number, _checked_site(site, "intervene"), as_action(action, site))
                 for number, (site, action) in enumerate(pairs))


def check_stop_after(stop_after: Any) -> Any:
    """`stop_after` checked for type (a site as `intervene` takes them, or None).

    Raises:
        InvalidArgumentTypeError: any other type.
    """
    return None if stop_after is None else _checked_site(stop_after, "stop_after")


def _checked_site(site: Any, what: str) -> Any:
    if isinstance(site, Selector) or (isinstance(site, str) and site) or (
            isinstance(site, int) and not isinstance(site, bool)):
        return site
    raise InvalidArgumentTypeError(
        f"{what} site {site!r} of type {type(site).__name__} is not accepted; a site is {_SITE_FORMS}")


class Interventions:
    """The sites and stop of one log_forward_pass call, against its model's modules: the plan
    for a pass, once any labels are resolved on a logged pass (`needs_probe`)."""

    def __init__(self, sites: tuple[Site, ...], stop_after: Any, named_modules: list) -> None:
        self.sites = sites
        self.stop_after = stop_after
        self._types = {address: type(module).__name__ for address, module in named_modules if address}
        self._ops: list[OpRule] = []
        self._exits: dict[str, list[ExitRule]] = {}
        self._later: list[Site] = []  # sites resolved on a logged pass
        for site in sites:
            self._place(site)
        self._stop_exit = self._module_call(stop_after) if stop_after is not None else None

    @property
    def needs_probe(self) -> bool:
        """Whether a site or the stop is found only in a logged pass (labels, positions)."""
        return bool(self._later) or (self.stop_after is not None and self._stop_exit is None)

    @property
    def runtime_numbers(self) -> set[int]:
        """The sites decided while the pass runs, which must fire or be reported."""
        return {s.number for s in self.sites} - {s.number for s in self._later}

    def probe_plan(self) -> OpPlan | None:
        """The plan of the pass that finds labels: no actions, only a stop decided while it
        runs (the probe need not run past it)."""
        return None if self._stop_exit is None else OpPlan(stop_exit=self._stop_exit)

    def plan(self, probe: ModelHistory | None) -> OpPlan:
        """The plan for a pass: the runtime rules, plus, with a probe, the sites and stop
        found in it (without a probe: the runtime rules only, for the probe itself).

        Raises:
            InterventionError: a site or the stop matches nothing in the probe, or names a
                pass no action can reach (an input, a buffer).
        """
        exits = {address: tuple(rules) for address, rules in self._exits.items()}
        if probe is None:
            return OpPlan(at_ops=tuple(self._ops), at_exits=exits, stop_exit=self._stop_exit)
        passes = all_passes(probe)
        positions = call_positions(passes)
        at_calls: dict[tuple[int, int], tuple[int, str, tuple[Act, ...]]] = {}
        for site in self._later:
            for index in sorted(self._found(probe, site.given, "intervene")):
                record = acted_on(passes, index, site.given)
                position = positions[record.op_index]
                _, _, acts = at_calls.get(position, (0, "", ()))
                at_calls[position] = (record.op_index, record.label,
                                      acts + (Act(site.number, site.given, site.action),))
        stop_node, stop_exit = None, self._stop_exit
        if self.stop_after is not None and stop_exit is None:
            stop_node, stop_exit = self._stop_in(probe, passes)
        return OpPlan(at_calls=at_calls, at_ops=tuple(self._ops), at_exits=exits,
                      expected=tuple(p.func_name for p in passes), stop_node=stop_node,
                      stop_exit=stop_exit)

    def _place(self, site: Site) -> None:
        """File `site` as an op rule, module-exit rules, or a site for the probe."""
        given, act = site.given, Act(site.number, site.given, site.action)
        selector = given if isinstance(given, Selector) else self._module_selector(given)
        if selector is None or selector.stage == "pass":
            self._later.append(site)
            return
        self._check_modules(selector, given)
        if selector.stage == "op":
            self._ops.append(OpRule(selector.op_test(self._types), act))
            return
        target = exit_part(selector)  # a module (maybe one call of it), or a module type
        condition = None if target is selector else selector.op_test(self._types)
        if isinstance(target, _Module):
            addresses, call = [target.address], target.call
        else:
            addresses = [a for a, kind in self._types.items() if kind == target.type_name]
            call = None
        for address in addresses:
            self._exits.setdefault(address, []).append(ExitRule(call, condition, act))

    def _module_selector(self, given: Any) -> Selector | None:
        """`select.module(...)` for a string naming a module ('h.0', 'cell:3'), else None."""
        if not isinstance(given, str):
            return None
        if given in self._types:
            return _Module(given)
        address, _, call = given.rpartition(":")
        if address in self._types and call.isdigit() and int(call) >= 1:
            return _Module(address, int(call))
        return None

    def _module_call(self, site: Any) -> tuple[str, int] | None:
        """(address, call) when `site` names one call of a module, decided while the pass runs."""
        selector = site if isinstance(site, _Module) else self._module_selector(site)
        if isinstance(selector, _Module):
            self._check_modules(selector, site)
            if selector.call is not None:
                return selector.address, selector.call
        return None

    def _check_modules(self, selector: Selector, given: Any) -> None:
        """Refuse before the pass a selector naming a module or type the model lacks."""
        for part in _parts(selector):
            if isinstance(part, (_Module, _InModule)) and part.address not in self._types:
                near = closest_matches(part.address, self._types)
                raise InterventionError(
                    f"site {given!r} names module {part.address!r}, which the model does not "
                    f"have{'; closest: ' + ', '.join(near) if near else ''}")
            if isinstance(part, _ModuleType) and part.type_name not in self._types.values():
                near = closest_matches(part.type_name, set(self._types.values()))
                raise InterventionError(
                    f"site {given!r} names module type {part.type_name!r}, which no module of the "
                    f"model has{'; closest: ' + ', '.join(near) if near else ''}")

    def _found(self, probe: ModelHistory, given: Any, what: str) -> set[int]:
        try:
            found = resolve(probe, [given])
        except InvalidOptionError:
            found = set()
        if not found:
            near = closest_matches(str(given), probe.layer_labels + list(probe.modules))
            raise InterventionError(
                f"{what} site {given!r} matches no pass of this model ({len(all_passes(probe))} "
                f"passes){'; closest: ' + ', '.join(near) if near else ''}; a site is {_SITE_FORMS}")
        return found

    def _stop_in(self, probe: ModelHistory, passes: list[PassRecord]) -> tuple[int | None, tuple | None]:
        """Where `stop_after` stops in a pass like `probe`: after the last call of a module,
        or after the last pass the site names."""
        given = self.stop_after
        selector = given if isinstance(given, _Module) else self._module_selector(given)
        if isinstance(selector, _Module):
            calls = probe.modules[selector.address].num_passes if selector.address in probe.modules else 0
            if not calls:
                raise InterventionError(f"stop_after={given!r}: module {selector.address!r} was not "
                                        "called in this pass, so the pass would never stop there")
            return None, (selector.address, calls)
        last = max(self._found(probe, given, "stop_after"))
        return acted_on(passes, last, given).op_index, None


def acted_on(passes: list[PassRecord], index: int, given: Any) -> PassRecord:
    """The op pass an action on pass `index` changes: itself, or for an output of the model
    the op that made it.

    Raises:
        InterventionError: an input, buffer or other tensor no op made, or a view's value
            after an in-place write (name the write instead).
    """
    record = passes[index]
    if record.kind == NodeKind.OUTPUT:
        parent = record.parents[0].label
        record = next(p for p in passes if p.label == parent)
    if record.kind in (NodeKind.OP, NodeKind.CREATED) and "view_written_by" not in record.extra:
        return record
    why = ("is a view's value after an in-place write into its base; name the op that wrote it"
           if "view_written_by" in record.extra else
           f"is a {record.kind.value} tensor, which no op of the model made; pass the edited "
           "tensor as input (or edit the model's state) instead")
    raise InterventionError(f"site {given!r} names pass {record.label!r}, which {why}")


def _parts(selector: Selector) -> list[Selector]:
    found, pending = [], [selector]
    while pending:
        item = pending.pop()
        found.append(item)
        pending += [getattr(item, name) for name in ("left", "right", "inner") if hasattr(item, name)]
    return found


def exit_part(selector: Selector) -> Selector:
    return next(p for p in _parts(selector) if isinstance(p, (_Module, _ModuleType)))
