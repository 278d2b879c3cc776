"""Counterfactual replay: a logged pass with interventions, recomputed from its saved values without the model."""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from time import perf_counter
from typing import Any, NamedTuple

import torch
from torch import nn

from torchlog.api import log_forward_pass
from torchlog.capture import (OP_CONTEXT_KEY, Act, Firing, FiringRecord, StopCapture, describe, find_tensors,
                              out_of_order, outputs_missing, returns_nothing_but_writes, rng_restored,
                              run_action)
from torchlog.errors import (InterventionError, InvalidArgumentTypeError, InvalidOptionError,
                             closest_matches)
from torchlog.history import ModelHistory, all_passes
from torchlog.interventions.records import intervention_records
from torchlog.sites.entries import Site, check_intervene
from torchlog.sites.random_ops import RANDOM_OPS
from torchlog.sites.resolve import acted_on, exit_part, module_selector
from torchlog.records import LayerRecord, NodeKind, PassRecord, TensorMeta
from torchlog.sites.select import Selector, ModuleSelector, view_of
from torchlog.sites.resolve import resolve
from torchlog.rerun import op_context, replaced, value_mismatch

__all__ = ["replay"]

# Ops that also write into arguments other than the ones their names announce (running stats).
_WRITES_OTHERS = frozenset({"batch_norm", "instance_norm"})
_RECORD_FIELDS = tuple(field.name for field in dataclasses.fields(PassRecord))
_AS_IS = contextlib.nullcontext()  # reusable: entering it changes nothing
_OUTSIDE = (NodeKind.INPUT, NodeKind.BUFFER, NodeKind.SOURCE)  # tensors that outlive the pass


class _Planned(NamedTuple):
    """One action at one pass, placed where the logged pass would have applied it."""

    order: tuple  # sorts the firings as an intervened run makes them
    act: Act
    firing: Firing
    exit_call: str | None  # 'h.1:2' for a module's output: readers inside that call see the value before
    exit_after: int  # op index of the call's last op: only readers after it see the action


def replay(history: ModelHistory, intervene: Any, *, verify: bool = False,
           model: nn.Module | None = None, inputs: Any = None,
           input_kwargs: dict[str, Any] | None = None) -> ModelHistory:
    """The run of `history` with `intervene` applied, recomputed from saved values alone.

    The model is not called. Only the passes downstream of the sites are recomputed: each
    op's saved function runs again on its parents' values (saved, or recomputed where a
    parent changed), with the RNG state recorded before it and in the grad and autocast
    state it ran in. Every other pass is the same PassRecord, holding the same saved tensor,
    as in `history`. Sites and actions are those of `log_forward_pass(intervene=...)`, and
    `new.interventions` lists the firings in the order an intervened run makes them. Where
    the model's ops do not depend on the values the intervention changes, the result equals
    that intervened run; where they do (a data-dependent branch, a side effect outside
    torch), replay cannot see it: `verify=True` checks against one run of the model.
    Parameters are read as they are now: replay before the model's weights change.

    Args:
        history: a history logged with `save_function_args=True` and every activation saved.
        intervene: {site: action} or a list of (site, action) pairs, as for log_forward_pass.
        verify: also run `model` once on the inputs with `intervene` (and any interventions
            `history` was logged with) and compare every pass with the replay.
        model: the model `history` was logged with; needed with `verify=True` only.
        inputs: the inputs `history` was logged with (as log_forward_pass takes them);
            needed with `verify=True` only.
        input_kwargs: the keyword inputs `history` was logged with, if any.

    Returns:
        A new ModelHistory; `history` is not changed.

    Raises:
        InvalidArgumentTypeError: `history` is not a ModelHistory, or a bad site or action.
        InvalidOptionError: `history` kept no function arguments (log it with
            save_function_args=True), no interventions, or `verify=True` without `model`
            and `inputs`.
        InterventionError: a site matches nothing or names a pass no action can reach; an
            action raised or returned a tensor of another shape, dtype or device; an op that
            must be recomputed cannot be (no saved function or parent value, a random op
            without its RNG state, a write into a tensor held outside the pass, a view's value
            after a write through another view), naming the op and why; with `verify`, the
            model's run differs, naming the first differing pass (the replay is on
            `exc.torchlog_history`).

    Example:
        >>> import torch, torchlog
        >>> from torchlog.interventions import zero_ablate
        >>> from torchlog.replay import replay
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
        >>> h = torchlog.log_forward_pass(net, torch.ones(2, 3), save_function_args=True)
        >>> new = replay(h, {'1': zero_ablate()})
        >>> [(r.label, r.action) for r in new.interventions], new['linear_1_1'] is h['linear_1_1']
        ([('relu_1_2', zero_ablate())], True)
        >>> torch.equal(new[-1].tensor_contents, net[2].bias.expand(2, 1))
        True
    """
    started = perf_counter()
    passes = _checked_history(history)
    earlier = _earlier_pairs(history)
    sites = tuple(Site(site.number + len(earlier), site.given, site.action) for site in check_intervene(intervene))
    if not sites:
        raise InvalidOptionError("replay needs interventions: pass intervene={site: action}, not None")
    if verify and (model is None or inputs is None):
        raise InvalidOptionError(
            f"verify=True runs the model once more, so it needs model= and inputs= (and input_kwargs= "
            f"where forward takes keywords), the ones the history was logged with; got model={model!r}")
    planned = _planned(history, passes, sites)
    replaced_passes, firings = _recompute(passes, planned, {r.label for r in history.interventions})
    new = _history_with(history, passes, replaced_passes, firings, perf_counter() - started)
    if verify:
        pairs = earlier + [(site.given, site.action) for site in sites]
        _verify(new, log_forward_pass(model, inputs, input_kwargs, random_seed=history.random_seed,
                                      intervene=pairs, stop_after=history.stopped_at))
    return new


def _checked_history(history: Any) -> list[PassRecord]:
    """Every pass of `history`, once it is known to hold what replay needs."""
    if not isinstance(history, ModelHistory):
        raise InvalidArgumentTypeError(
            f"replay takes a ModelHistory (from torchlog.log_forward_pass(..., save_function_args="
            f"True)), got {history!r} of type {type(history).__name__}")
    if history.info.activation_postfunc is not None:
        raise InvalidOptionError(
            f"{history!r} was logged with activation_postfunc={history.info.activation_postfunc}, so its "
            "saved values are that function's results, and ops re-run from them would compute "
            "something else; log it without activation_postfunc (and with save_function_args=True)")
    passes = all_passes(history)
    if not any(p.func_args is not None for p in passes):
        raise InvalidOptionError(
            f"{history!r} kept no function arguments, so its ops cannot be re-run; log it with "
            "torchlog.log_forward_pass(model, x, save_function_args=True)")
    return passes


# ----- sites -> actions at passes ----------------------------------------------------------------
def _planned(history: ModelHistory, passes: list[PassRecord], sites: tuple[Site, ...]) -> dict[int, list[_Planned]]:
    """The actions at each pass (by op index), in the order they apply to its value.

    Module addresses and exit-stage selectors act on the first tensor of each module call's
    output, op-stage selectors on every op they name, everything else (labels, positions,
    mixed selectors) on the passes `torchlog.selection.resolve` finds: as an intervened run
    does (torchlog.interventions.sites).

    Raises:
        InterventionError: a site matches no pass, or names one no action can reach.
    """
    types = {address: module.type_name for address, module in history.modules.items()}
    found: dict[int, list[_Planned]] = {}
    for site in sites:
        given = site.given
        selector = given if isinstance(given, Selector) else module_selector(given, types)
        if selector is not None and selector.stage == "entry":
            raise InterventionError(
                f"site {given!r} acts on what a module receives, which replay cannot recompute from "
                "the saved passes (the value stays what it was for readers outside the module); run "
                "the model with it: log_forward_pass(..., intervene=...) or torchlog.run")
        if selector is not None and selector.stage == "exit":
            targets = list(_exit_targets(history, site, selector, types))
        elif selector is not None and selector.stage == "op":
            targets = [_at_op(passes[i], site, None) for i in sorted(selector.passes_in(history))
                       if "view_written_by" not in passes[i].extra]
        else:
            targets = [_at_op(acted_on(passes, i, given), site, True) for i in _resolved(history, given)]
        if not targets:
            near = closest_matches(str(given), history.layer_labels + list(history.modules))
            raise InterventionError(
                f"intervene site {given!r} matches no pass of this history ({len(passes)} passes)"
                f"{'; closest: ' + ', '.join(near) if near else ''}; a site is a layer label, a module "
                "address, an int position or a torchlog.select selector")
        for target in targets:
            found.setdefault(target.firing.op_index, []).append(target)
    for targets in found.values():
        targets.sort(key=lambda t: t.order)
        for position, target in enumerate(targets):
            later = [t for t in targets[:position] if t.act.number > target.act.number]
            if target.exit_call is not None and later:
                firing = target.firing
                raise InterventionError(out_of_order(target.act.site, later[0].act.site, firing.op_index,
                                                     firing.func_name, firing.module_call))
    return found


def _resolved(history: ModelHistory, given: Any) -> list[int]:
    try:
        return sorted(resolve(history, [given]))
    except InvalidOptionError:  # matches nothing: said with the site's own words by the caller
        return []


def _at_op(record: PassRecord, site: Site, by_label: bool | None) -> _Planned:
    """An action applied as the op returns (label sites name the pass in the firing)."""
    firing = Firing(site.given, record.op_index, record.func_name, None,
                    record.label if by_label else None)
    return _Planned((record.op_index, 0, 0, site.number), Act(site.number, site.given, site.action),
                    firing, None, record.op_index)


def _exit_targets(history: ModelHistory, site: Site, selector: Selector,
                  types: dict[str, str]) -> Iterator[_Planned]:
    """An action on the first output of each module call an exit-stage selector names."""
    target = exit_part(selector)
    condition = None if target is selector else selector.op_test(types)
    if isinstance(target, ModuleSelector):
        addresses, call, output = [target.address], target.call, target.output or 0
    else:
        addresses, call, output = [a for a, kind in types.items() if kind == target.type_name], None, 0
    by_label = {p.label: p for p in all_passes(history)}
    for address in addresses:
        module = history.modules.get(address)
        for number, outputs in enumerate(module.call_outputs if module is not None else (), start=1):
            if not outputs or (call is not None and number != call):
                continue
            if output >= len(outputs):
                raise InterventionError(outputs_missing(site.given, (address, number), output, len(outputs), None))
            record = by_label[outputs[output]]
            if condition is not None and not condition(view_of(record)):
                continue
            text = f"{address}:{number}"
            inside = [by_label[label].op_index for label in module.call_layers[number - 1]
                      if label in by_label]
            after = max(inside, default=record.op_index)
            firing = Firing(site.given, record.op_index, record.func_name, (address, number), None,
                            (output, len(outputs)))
            order = (after, 1, record.output_of_modules.index(text), site.number)
            yield _Planned(order, Act(site.number, site.given, site.action), firing, text, after)


# ----- recomputing ---------------------------------------------------------------------------
class _Replay:
    """The values of one replay: saved ones read once, recomputed ones, and the versions a
    module-exit action leaves for readers inside and after the module call."""

    def __init__(self, passes: list[PassRecord], fixed: set[str]) -> None:
        self.passes = passes
        self.fixed = fixed  # passes the history's own interventions changed
        self.index = {p.label: p.op_index for p in passes}
        self.saved: dict[str, Any] = {}  # label -> saved value, read once (a log file reads from disk)
        self.new: dict[str, torch.Tensor] = {}  # label -> value after replay and actions
        self.versions: dict[str, list[tuple[str | None, int, torch.Tensor]]] = {}
        self.calls: dict[int, list[torch.Tensor]] = {}  # id(func_args) -> outputs of that call

    def original(self, label: str) -> Any:
        value = self.saved.get(label)
        if value is None and label not in self.saved:
            value = self.saved[label] = self.passes[self.index[label]].tensor_contents
        return value

    def seen(self, label: str, reader: PassRecord) -> Any:
        """The value of pass `label` that op `reader` read."""
        steps = self.versions.get(label)
        if steps is None:
            return self.new[label] if label in self.new else self.original(label)
        value = steps[0][2]
        for call, after, later in steps[1:]:
            if reader.op_index > after and call not in reader.containing_modules:
                value = later
        return value


def _recompute(passes: list[PassRecord], planned: dict[int, list[_Planned]],
               fixed: set[str]) -> tuple[dict[int, PassRecord], list]:
    """New records for every pass an action or a changed parent reaches, by op index, and
    the firings (FiringRecords, in the order an intervened run makes them). `fixed`: the
    passes the history's own interventions changed, which replay cannot recompute."""
    state = _Replay(passes, fixed)
    replaced_passes: dict[int, PassRecord] = {}
    firings: list[tuple[tuple, FiringRecord]] = []
    for record in passes[min(planned):]:
        parents = {edge.label: state.seen(edge.label, record) for edge in record.parents}
        changed = any(value is not state.original(label) for label, value in parents.items())
        acts = planned.get(record.op_index)
        if not changed and not acts:
            continue
        started = perf_counter()
        value = _replayed(record, parents, state) if changed else _saved_value(record, state)
        original = state.original(record.label)
        if isinstance(original, torch.Tensor) and not original.requires_grad and value.requires_grad:
            value = value.detach()  # kept as the history kept its values: without a graph
        if acts:
            value = _acted(record, value, acts, state, firings)
        state.new[record.label] = value
        replaced_passes[record.op_index] = _with_value(record, value, perf_counter() - started)
    firings.sort(key=lambda pair: pair[0])
    return replaced_passes, [fired for _, fired in firings]


def _with_value(record: PassRecord, value: torch.Tensor, elapsed_s: float) -> PassRecord:
    """A copy of `record` holding `value` (built positionally: dataclasses.replace checks each
    field by name, which costs more than the op itself for most ops)."""
    new = PassRecord(*[getattr(record, name) for name in _RECORD_FIELDS])
    new.saved, new.tensor_meta, new.grad_saved = value, TensorMeta.of(value), None
    new.elapsed_s, new.extra = elapsed_s, dict(record.extra)
    return new


def _saved_value(record: PassRecord, state: _Replay) -> torch.Tensor:
    value = state.original(record.label)
    if not isinstance(value, torch.Tensor):
        raise InterventionError(
            f"pass {record.label!r} kept no saved value to act on; log the history with "
            "layers_to_save='all' (and no activation_postfunc)")
    return value


def _replayed(record: PassRecord, parents: dict[str, Any], state: _Replay) -> torch.Tensor:
    """The op's output recomputed from its parents' values (`parents`: label -> value read).

    Raises:
        InterventionError: the op cannot be replayed (see `_unreplayable`), or raised.
    """
    if record.kind == NodeKind.OUTPUT:  # the model's output: its producer's value
        return parents[record.parents[0].label]
    why = _unreplayable(record, parents, state)
    if why is not None:
        raise InterventionError(f"replay cannot recompute pass {record.label!r} ({record.func_name!r}), "
                                f"which the intervention reaches: {why}")
    outputs = state.calls.get(id(record.func_args))
    if outputs is None:
        try:
            outputs = _call(record, parents, _draws(record, state.passes))
        except Exception as exc:
            raise InterventionError(
                f"replaying pass {record.label!r} ({record.func_name!r}) on the changed values raised "
                f"{type(exc).__name__}: {exc}") from exc
        state.calls[id(record.func_args)] = outputs
    if record.output_index >= len(outputs):
        raise InterventionError(
            f"replaying pass {record.label!r} ({record.func_name!r}) gave {len(outputs)} tensors, but "
            f"the pass is output {record.output_index} of its op")
    return outputs[record.output_index]


def _unreplayable(record: PassRecord, parents: dict[str, Any], state: _Replay) -> str | None:
    """Why the op of `record` cannot be re-run on other values (in words), or None."""
    if record.label in state.fixed:
        return ("an intervention the history was logged with changed it, and replay does not apply "
                "that one again; replay from a history logged without interventions, passing them all")
    if "view_written_by" in record.extra:
        return ("it is the value of a view after an in-place write through another view of its "
                "storage, which re-running one op does not give")
    if record.func_args is None:
        return ("its function and arguments were not kept (log with save_function_args=True; a "
                "Triton kernel launch keeps none)")
    func, args, kwargs = record.func_args
    if func is torch.autograd.grad:
        return "it is torch.autograd.grad, which needs the autograd graph of the logged run"
    if record.rng_state is None and _is_random(record.func_name, args, kwargs):
        return "it draws random numbers and its recorded RNG state is missing"
    for label, value in parents.items():
        parent = state.passes[state.index[label]]
        if not isinstance(value, torch.Tensor):
            return (f"its parent {label!r} kept no saved value; log the history with "
                    "layers_to_save='all'")
        if tuple(value.shape) != tuple(parent.tensor_meta.shape) or value.dtype != parent.tensor_meta.dtype:
            return (f"the saved value of its parent {label!r} is not that op's output (shape "
                    f"{tuple(value.shape)} instead of {tuple(parent.tensor_meta.shape)}: an "
                    "activation_postfunc?); log without activation_postfunc")
    return _outside_write(record, state)


def _outside_write(record: PassRecord, state: _Replay) -> str | None:
    """Why the op's write is a side effect replay cannot make, or None when it writes nothing
    held outside the pass (an input, a buffer, a parameter, a tensor made before forward)."""
    func, args, kwargs = record.func_args
    written: list[Any] = ["out"] if "out" in kwargs else []
    if _writes_first(record, func, args, kwargs) and not written:
        written.append(0 if args else next((k for k in ("self", "input", "tensor") if k in kwargs), 0))
    for slot in written:
        edge = next((e for e in record.parents if e.arg == slot), None)
        if edge is None:
            return "it writes in place into a parameter or another tensor that is not a pass of this run"
        target = state.passes[state.index[edge.label]]
        if target.kind in _OUTSIDE:
            where = f" ({target.buffer_address})" if target.buffer_address else ""
            return (f"it writes in place into {target.kind.value} {edge.label!r}{where}, which outlives "
                    "the forward pass: a side effect replay cannot make")
    return None


def _writes_first(record: PassRecord, func: Any, args: tuple, kwargs: dict) -> bool:
    description = describe(func)
    slot = description.inplace_slot
    flag = kwargs.get("inplace", args[slot] if slot is not None and slot < len(args) else False)
    return record.is_inplace or description.writes_first_arg or bool(flag)


def _is_random(name: str, args: tuple, kwargs: dict) -> bool:
    if name not in RANDOM_OPS:
        return False
    if "dropout" in name:  # random only in training, and for p > 0
        training = kwargs.get("training", kwargs.get("train", args[2] if len(args) > 2 else True))
        p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
        return bool(training) and p != 0
    return True


def _draws(record: PassRecord, passes: list[PassRecord]) -> bool:
    """Whether the op drew random numbers when logged: capture shares one RNG state object
    between consecutive ops while none draws, so a state unlike the next op's means a draw."""
    state = record.rng_state
    if state is None:
        return False
    for index in range(record.op_index + 1, len(passes)):
        later = passes[index]
        if later.rng_state is not None and later.func_args is not record.func_args:
            return later.rng_state is not state
    return True


def _call(record: PassRecord, parents: dict[str, Any], draws: bool) -> list[torch.Tensor]:
    """Call the op's saved function with each parent's value where its tensor was; every
    tensor of the result, in the order capture numbered them. An op that may write into an
    argument gets its own copy of each parent: saved values are shared with the history."""
    func, args, kwargs = record.func_args
    slots = {"args": list(args), "kwargs": dict(kwargs)}
    copy = record.func_name in _WRITES_OTHERS or _writes_first(record, func, args, kwargs) or "out" in kwargs
    copies: dict[str, torch.Tensor] = {}
    for edge in record.parents:
        value = parents[edge.label]
        if copy:
            value = copies.get(edge.label)
            if value is None:
                value = copies[edge.label] = parents[edge.label].clone()
        path = edge.arg if isinstance(edge.arg, tuple) else (edge.arg,)
        container = slots["args"] if isinstance(path[0], int) else slots["kwargs"]
        container[path[0]] = replaced(container[path[0]], path[1:], value)
    with _context_of(record), rng_restored(record.rng_state) if draws else _AS_IS:
        out = func(*slots["args"], **slots["kwargs"])
    if returns_nothing_but_writes(func):  # `t[i] = v`: the result is `t`
        return [slots["args"][0]]
    return [out] if isinstance(out, torch.Tensor) else [t for t, _ in find_tensors(out)]


def _context_of(record: PassRecord) -> Any:
    """The grad, inference and autocast state the op ran in (rerun.py's op_context),
    or nothing to enter when only grad mode was recorded and it is already as recorded."""
    context = record.extra.get(OP_CONTEXT_KEY)
    if context is None:
        return _AS_IS if torch.is_grad_enabled() else op_context(None)
    if len(context) == 1 and "grad" in context and torch.is_grad_enabled() == bool(context["grad"]):
        return _AS_IS
    return op_context(context)


def _acted(record: PassRecord, value: torch.Tensor, acts: list[_Planned], state: _Replay,
           firings: list) -> torch.Tensor:
    """`value` after each action at this pass; module-exit actions also leave the value
    before them for the readers inside their module call."""
    steps: list[tuple[str | None, int, torch.Tensor]] = []
    for planned in acts:
        if planned.exit_call is not None and not steps:
            steps.append((None, -1, value))
        value = _applied(planned, value, firings)
        if planned.exit_call is not None:
            steps.append((planned.exit_call, planned.exit_after, value))
    if steps:
        state.versions[record.label] = steps
    return value


def _applied(planned: _Planned, value: torch.Tensor, firings: list) -> torch.Tensor:
    """One action on `value`, checked as an intervened run checks it (capture/plan.py's
    `run_action`), and noted in `firings`."""
    try:
        new, record = run_action(planned.act, value, planned.firing)
    except StopCapture as stop:
        raise stop.error from stop.error.__cause__
    firings.append((planned.order, record))
    return new


# ----- the new history ---------------------------------------------------------------------------
def _history_with(history: ModelHistory, passes: list[PassRecord], new: dict[int, PassRecord],
                  firings: list[FiringRecord], elapsed_s: float) -> ModelHistory:
    """`history` with the records in `new` (by op index) in place of its own; every other
    record, the modules and the labels shared."""
    everything = [new.get(p.op_index, p) for p in passes]
    records = intervention_records(tuple(firings), everything)
    visible = [everything[p.op_index] for p in history.passes]
    layers = [layer if not any(p.op_index in new for p in layer.passes) else
              LayerRecord(layer.label, layer.layer_type, tuple(everything[p.op_index] for p in layer.passes))
              for layer in history.layers]
    info = dataclasses.replace(history.info, elapsed_s=elapsed_s, all_passes=everything,
                               interventions=history.info.interventions + records,
                               num_gradient_hooks=None)
    return ModelHistory(visible, layers, dict(history.modules), info)


# ----- verify --------------------------------------------------------------------------------
def _earlier_pairs(history: ModelHistory) -> list[tuple[Any, Any]]:
    """The (site, action) pairs `history` itself was logged with, for the verifying run."""
    seen: dict[int, tuple[Any, Any]] = {}
    for record in history.interventions:
        seen.setdefault(record.number, (record.site, record.action))
    return list(seen.values())


def _verify(new: ModelHistory, rerun: ModelHistory) -> None:
    """Refuse a replay that differs from the model's own intervened run, naming the first
    pass where they part (the replay is on the error's `torchlog_history`)."""
    mine, theirs = all_passes(new), all_passes(rerun)
    problem = None
    for a, b in zip(mine, theirs):
        if a.label != b.label or a.func_name != b.func_name:
            problem = (f"at position {a.op_index} the model ran {b.label!r} ({b.func_name!r}) where the "
                       f"replay has {a.label!r} ({a.func_name!r}): its ops depend on values the "
                       "intervention changed (a data-dependent branch)")
            break
        if isinstance(a.tensor_contents, torch.Tensor) and isinstance(b.tensor_contents, torch.Tensor):
            mismatch = value_mismatch(b.tensor_contents, a.tensor_contents)
            if mismatch is not None:
                diff = "" if mismatch[1] is None else f" (max difference {mismatch[1]:.3g})"
                problem = (f"pass {a.label!r} differs: {mismatch[0]}{diff}; the model computes something "
                           "the saved ops do not (a data-dependent branch, or a side effect or state "
                           "outside torch)")
                break
    if problem is None and len(mine) != len(theirs):
        problem = (f"the model ran {len(theirs)} passes where the replay has {len(mine)} (a "
                   "data-dependent branch)")
    if problem is not None:
        error = InterventionError(f"verify: the replay differs from an intervened run of the model: {problem}")
        error.torchlog_history = new
        raise error
