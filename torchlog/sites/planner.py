"""From the user's `intervene` and `stop_after` to the plan capture acts on (capture/plan.py).

Sites are checked when the options are made, resolved once per call: module addresses and
selectors that can be decided while the pass runs become rules of the plan directly; labels,
positions, substrings and mixed selectors are resolved on a logged pass first (the probe,
the same pass `layers_to_save` resolves on, through `torchlog.selection.resolve`), and become
positions the intervened pass must reach running the same ops.
"""
from __future__ import annotations

from typing import Any

from torchlog.capture.plan import Act, ExitRule, OpPlan, OpRule
from torchlog.errors import InterventionError, InvalidOptionError, closest_matches
from torchlog.history import ModelHistory, all_passes
from torchlog.records import PassRecord
from torchlog.sites.entries import SITE_FORMS, Site
from torchlog.sites.resolve import acted_on, call_positions, exit_part, parts, resolve
from torchlog.sites.select import Selector, _InModule, _Module, _ModuleType

__all__ = ["Interventions"]


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
        for part in parts(selector):
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
                f"passes){'; closest: ' + ', '.join(near) if near else ''}; a site is {SITE_FORMS}")
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


