"""From what a call names (`layers_to_save`, `intervene`, `stop_after`) to the plan capture honours.

Everything that can be decided while the pass runs becomes part of the first plan:
module addresses (calls counted as they happen) and selectors on function, module and
shape are rules; op positions and labels of ops outside loops are node indexes (a label's
last number is its node's index when no loop folded before it), guessed, and checked on
the finished history (`check`). Entries no rule can decide (substrings, short labels,
negative positions) save everything, and the history keeps exactly what they name. Only
what truly needs a finished pass (an intervention on a later pass of a loop, a position
from the end, a substring) is resolved on a probe, a logged pass acting on nothing; the
API keeps probes per model and input signature (sites/probes.py), and falls back to one
when a guess was wrong.
"""
from __future__ import annotations

import inspect
from typing import Any

from torchlog.capture import Act, ExitRule, OpPlan, OpRule
from torchlog.errors import InterventionError, InvalidOptionError, closest_matches
from torchlog.history import ModelHistory, all_passes
from torchlog.labels import parse_label
from torchlog.records import PassRecord
from torchlog.sites.entries import SITE_FORMS, Site
from torchlog.sites.resolve import acted_on, call_positions, exit_part, module_selector, parts, resolve
from torchlog.sites.select import (InModuleSelector, ModuleInputSelector, ModuleSelector, ModuleTypeSelector,
                                   Selector, WhereSelector)

__all__ = ["Planner", "reached"]


class Planner:
    """The saves, sites and stop of one call, against its model's modules.

    `first_plan()` is the plan of a pass run without a probe (None when a site needs one);
    `check(history)` says whether that pass did what was asked (else the API probes);
    `plan(probe)` is the exact plan once a probe resolved everything.
    """

    def __init__(self, entries: list | None, sites: tuple[Site, ...], stop_after: Any,
                 named_modules: list) -> None:
        self.entries = entries if entries else None  # a list to save exactly, else None
        self.sites = sites
        self.stop_after = stop_after
        self._types = {address: type(module).__name__ for address, module in named_modules if address}
        self._modules = dict(named_modules)
        self._ops: list[OpRule] = []
        self._exits: dict[str, list[ExitRule]] = {}
        self._entries: dict[str, list[ExitRule]] = {}  # module-input sites, by address
        self._later: list[Site] = []  # sites resolved on a probe
        self._guesses: dict[int, list[tuple[str, Act]]] = {}  # node index -> (layer type, act)
        self._guessed: list[Site] = []  # the label sites behind them
        for site in sites:
            self._place(site)
        self._stop_exit = self._module_call(stop_after) if stop_after is not None else None
        # A stop at a label's node is guessed only for a pass written out (`relu_1_2:1`): a
        # stopped pass cannot show whether a layer named whole has passes after it.
        self._stop_guess = (None if stop_after is None or self._stop_exit is not None
                            else _node_guess(stop_after, pass_written=True))
        self.save_everything = False  # an entry only a finished pass can decide
        self._first_plan: OpPlan | None = None
        self._save_nodes: set[int] = set()
        self._save_exits: dict[str, set[int] | None] = {}
        self._save_ops: list = []
        for entry in self.entries or ():
            self._place_entry(entry)

    @property
    def needs_probe(self) -> bool:
        """Whether a site or the stop is found only on a probe (a later pass of a loop, a
        position from the end, a substring, a mixed selector)."""
        stop_open = self.stop_after is not None and self._stop_exit is None and self._stop_guess is None
        return bool(self._later) or stop_open

    @property
    def guesses(self) -> bool:
        """Whether the first plan guesses nodes (label sites, a label stop) or saves more
        than asked: `check` must confirm it on the finished history."""
        return bool(self._guessed) or self._stop_guess is not None or self.entries is not None

    def first_plan(self) -> OpPlan:
        """The plan of a pass with no probe: runtime rules, guessed label sites and stop,
        and the saves decided as the pass runs (the capture's `save_indices` and
        `save_all` come from `save_indices` and `save_everything`). Made once: the planner
        is not changed after it is built, and a plan is frozen."""
        if self._first_plan is None:
            self._first_plan = self._make_first_plan()
        return self._first_plan

    def _make_first_plan(self) -> OpPlan:
        stop_node, stop_type = self._stop_guess if self._stop_guess is not None else (None, None)
        return OpPlan(at_ops=tuple(self._ops), at_exits=self._exit_rules(), at_entries=self._entry_rules(),
                      stop_exit=self._stop_exit,
                      stop_node=stop_node, stop_type=stop_type,
                      at_nodes={index: (found[0][0], tuple(act for _, act in found))
                                for index, found in self._guesses.items()},
                      save_exits={address: tuple(sorted(calls or ())) for address, calls in self._save_exits.items()},
                      save_ops=tuple(self._save_ops))

    @property
    def save_indices(self) -> frozenset[int]:
        """Node indexes the first plan saves: positions and guessed labels."""
        return frozenset(self._save_nodes)

    def check(self, history: ModelHistory) -> set[int] | None:
        """On the finished history of a first-plan pass: the op indexes it keeps (every
        saved pass without a list), or None when a guess was wrong (a label site acted on
        another node, the stop fell elsewhere, or a chosen pass was not saved)."""
        passes = all_passes(history)
        fired: dict[int, set[int]] = {}
        for record in history.info.interventions:
            fired.setdefault(record.number, set()).add(record.op_index)
        ended = history.is_partial or history.stopped_at is not None
        for site in self._guessed:
            try:
                found = resolve(history, [site.given])
            except InvalidOptionError:
                found = set()
            if not found and not ended:
                self._found(history, site.given, "intervene")  # names nothing in a whole pass: raises
            try:
                wanted = {acted_on(passes, i, site.given).op_index for i in found}
            except InterventionError:
                return None
            if fired.get(site.number, set()) != wanted:
                return None
        if self._stop_guess is not None and not self._stopped_as_asked(history, passes):
            return None
        saved = {p.op_index for p in passes if p.saved is not None}
        if self.entries is None:
            return saved
        # An entry that names nothing in a whole pass raises here (InvalidOptionError).
        chosen = reached(history, self.entries) if history.is_partial else resolve(history, self.entries)
        return chosen if chosen <= saved else None

    def _stopped_as_asked(self, history: ModelHistory, passes: list[PassRecord]) -> bool:
        if history.stopped_at is None:
            return False
        try:
            last = max(resolve(history, [self.stop_after]))
        except InvalidOptionError:
            return False
        return acted_on(passes, last, self.stop_after).label == history.stopped_at

    def probe_plan(self, guess_stop: bool = False) -> OpPlan | None:
        """The plan of the pass that finds labels: no actions, only a stop decided while it
        runs, a module call or, with `guess_stop`, a label's pass guessed by its node (the
        probe need not run past it)."""
        if self._stop_exit is not None:
            return OpPlan(stop_exit=self._stop_exit)
        if guess_stop and self._stop_guess is not None:
            return OpPlan(stop_node=self._stop_guess[0], stop_type=self._stop_guess[1])
        return None

    def plan(self, probe: ModelHistory) -> OpPlan:
        """The exact plan for a pass like `probe`: the runtime rules, and every other site
        and the stop resolved on it, as call positions the pass must reach running the
        probe's ops.

        Raises:
            InterventionError: a site or the stop matches nothing in the probe, or names a
                pass no action can reach (an input, a buffer).
        """
        passes = all_passes(probe)
        positions = call_positions(passes)
        at_calls: dict[tuple[int, int], tuple[int, str, tuple[Act, ...]]] = {}
        for site in self._later + self._guessed:
            for index in sorted(self._found(probe, site.given, "intervene")):
                record = acted_on(passes, index, site.given)
                position = positions[record.op_index]
                _, _, acts = at_calls.get(position, (0, "", ()))
                at_calls[position] = (record.op_index, record.label,
                                      acts + (Act(site.number, site.given, site.action),))
        stop_node, stop_exit = None, self._stop_exit
        if self.stop_after is not None and stop_exit is None:
            stop_node, stop_exit = self._stop_in(probe, passes)
        names = tuple(p.func_name for p in passes)
        calls = tuple(names[i] for i, (_, output) in sorted(positions.items()) if output == 0)
        return OpPlan(at_calls=at_calls, at_ops=tuple(self._ops), at_exits=self._exit_rules(),
                      at_entries=self._entry_rules(), expected=names, expected_calls=calls, stop_node=stop_node, stop_exit=stop_exit,
                      stop_call=positions[stop_node][0] if stop_node in positions else None)

    def _exit_rules(self) -> dict[str, tuple[ExitRule, ...]]:
        return {address: tuple(rules) for address, rules in self._exits.items()}

    def _entry_rules(self) -> dict[str, tuple[ExitRule, ...]]:
        return {address: tuple(rules) for address, rules in self._entries.items()}

    def _place_entry(self, entry: Any) -> None:
        """File a `layers_to_save` entry as a save decided while the pass runs, or as one
        only the finished pass decides (then the pass saves everything)."""
        selector = entry if isinstance(entry, Selector) else self._module_selector(entry)
        if selector is not None and selector.stage == "op" and not _uses_position(selector):
            self._save_ops.append(selector.op_test(self._types))
        elif selector is not None and selector.stage == "exit":
            self._check_modules(selector, entry)
            target = exit_part(selector)
            addresses = ([target.address] if isinstance(target, ModuleSelector) else
                         [a for a, kind in self._types.items() if kind == target.type_name])
            for address in addresses:
                call = target.call if isinstance(target, ModuleSelector) else None
                known = self._save_exits.get(address, set())
                self._save_exits[address] = None if call is None or known is None else known | {call}
        elif isinstance(entry, int) and entry >= 0:
            self._save_nodes.add(entry)
        elif isinstance(entry, str) and _node_guess(entry) is not None:
            self._save_nodes.add(_node_guess(entry)[0])
        else:
            self.save_everything = True

    def _place(self, site: Site) -> None:
        """File `site` as an op rule, module-exit rules, or a site for the probe."""
        given, act = site.given, Act(site.number, site.given, site.action)
        selector = given if isinstance(given, Selector) else self._module_selector(given)
        if selector is None or selector.stage == "pass":
            guess = _node_guess(given) if isinstance(given, str) else None
            if guess is None:
                self._later.append(site)
            else:
                self._guesses.setdefault(guess[0], []).append((guess[1], act))
                self._guessed.append(site)
            return
        self._check_modules(selector, given)
        if selector.stage == "op":
            self._ops.append(OpRule(selector.op_test(self._types), act, _uses_position(selector)))
            return
        if selector.stage == "entry":  # a module input: `select.module_input(address, call, index)`
            _check_takes_inputs(self._modules[selector.address], given)
            self._entries.setdefault(selector.address, []).append(
                ExitRule(selector.call, None, act, selector.index))
            return
        target = exit_part(selector)  # a module (maybe one call of it), or a module type
        condition = None if target is selector else selector.op_test(self._types)
        if isinstance(target, ModuleSelector):
            addresses, call, output = [target.address], target.call, target.output or 0
        else:
            addresses = [a for a, kind in self._types.items() if kind == target.type_name]
            call, output = None, 0
        for address in addresses:
            self._exits.setdefault(address, []).append(ExitRule(call, condition, act, output))

    def _module_selector(self, given: Any) -> Selector | None:
        """`select.module(...)` for a string naming a module ('h.0', 'cell:3'), else None."""
        return module_selector(given, self._types)

    def _module_call(self, site: Any) -> tuple[str, int] | None:
        """(address, call) when `site` names a module call, decided while the pass runs: a
        module address without a call number names its first call (the pass stops as soon
        as it returns; name 'cell:3' to stop after a later one)."""
        selector = site if isinstance(site, ModuleSelector) else self._module_selector(site)
        if isinstance(selector, ModuleSelector):
            self._check_modules(selector, site)
            return selector.address, selector.call or 1
        return None

    def _check_modules(self, selector: Selector, given: Any) -> None:
        """Refuse before the pass a selector naming a module or type the model lacks."""
        for part in parts(selector):
            if (isinstance(part, (ModuleSelector, InModuleSelector, ModuleInputSelector))
                    and part.address not in self._types):
                near = closest_matches(part.address, self._types)
                raise InterventionError(
                    f"site {given!r} names module {part.address!r}, which the model does not "
                    f"have{'; closest: ' + ', '.join(near) if near else ''}")
            if isinstance(part, ModuleTypeSelector) and part.type_name not in self._types.values():
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
        """Where `stop_after` stops in a pass like `probe`: after the last pass the site names."""
        given = self.stop_after
        last = max(self._found(probe, given, "stop_after"))
        return acted_on(passes, last, given).op_index, None




def _node_guess(given: Any, pass_written: bool = False) -> tuple[int, str] | None:
    """(node index, layer type) a full label names when no loop folded before it: its
    last number, for its first pass. None for anything else (short labels, later passes,
    and with `pass_written` a label without its pass)."""
    if not isinstance(given, str):
        return None
    parsed = parse_label(given)
    if parsed is None or parsed.total_num is None or parsed.pass_num not in ((1,) if pass_written else (None, 1)):
        return None
    return parsed.total_num, parsed.layer_type


def _uses_position(selector: Selector) -> bool:
    """Whether an op-stage selector may read an op's position (a `where` predicate)."""
    return any(isinstance(part, WhereSelector) for part in parts(selector))


def reached(partial: ModelHistory, entries: list) -> set[int]:
    """Op indexes the entries select among the ops that ran before the model raised."""
    chosen: set[int] = set()
    for entry in entries:
        try:
            chosen |= resolve(partial, [entry])
        except InvalidOptionError:
            continue  # it may name an op after the failure, which never ran: nothing to save
    return chosen


def _check_takes_inputs(module: Any, given: Any) -> None:
    """Refuse, before the pass, a module-input site on a module whose forward takes no argument."""
    try:
        parameters = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return  # a forward without a readable signature: the pass says what it received
    if not parameters:
        raise InterventionError(
            f"site {given!r} names an input of {type(module).__name__}, whose forward takes no "
            "argument, so there is nothing to act on; name an op inside it or its output instead")
