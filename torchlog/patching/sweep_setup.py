"""The set-up every patched run of a sweep shares: the sites found on the clean run, their
clean values and both metrics, and the corrupted run checked against the clean one.

One logged pass of the clean input resolves the sites (as `layers_to_save` and `intervene`
resolve them) and gives their values and the clean output; one lean pass of the corrupted
input (`capture/lean.py`) gives its calls, its values at the sites and its output.
`attribution` leaves the corrupted pass out: its own corrupted run is checked instead.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from torchlog.api import log_forward_pass
from torchlog.arguments import positional_args
from torchlog.capture import call_names, run_lean
from torchlog.errors import InterventionError, InvalidArgumentTypeError, InvalidOptionError
from torchlog.history import ModelHistory, all_passes
from torchlog.model_state import model_kept
from torchlog.patching.prefix import rng_states, same_states
from torchlog.patching.runs import Target
from torchlog.sites.entries import check_site
from torchlog.sites.resolve import acted_on, call_positions, resolve

__all__ = ["Setup", "check_corrupted", "check_metrics", "check_positions", "find_targets", "number",
           "prepare_sweep"]


@dataclass
class Setup:
    """What every patched run of one sweep shares: inputs, targets with clean values, baselines."""

    model: nn.Module
    clean: tuple  # positional args
    corrupted: tuple
    kwargs: dict
    targets: list[Target]
    clean_values: dict[str, torch.Tensor]  # pass label -> clean value
    clean_metric: float
    corrupted_metric: float  # nan until a corrupted run measured it
    history: ModelHistory  # the clean run, metadata only
    named: dict[str, nn.Module]
    corrupted_output: Any = None  # what forward returned for the corrupted input
    calls: list = field(default_factory=list)  # the clean run's op names, one per call
    batched_calls: dict = field(default_factory=dict)  # rows -> {unbatched call: batched call}
    batched_args: dict = field(default_factory=dict)  # rows -> the corrupted input repeated
    prefixes: dict = field(default_factory=dict)  # (rows or None, lean) -> Prefix of its runs
    corrupted_values: dict = field(default_factory=dict)  # pass label -> the corrupted run's value
    is_deterministic: bool = False  # the corrupted run drew no random numbers


def prepare_sweep(model: nn.Module, clean: Any, corrupted: Any, sites: Any,
                  metric: Callable[[Any], Any], input_kwargs: dict | None, *,
                  run_corrupted: bool = True) -> Setup:
    """Resolve the sites on the clean run, keep their clean values, and measure its metric;
    with `run_corrupted`, also run the corrupted input once to check its ops and shapes
    (check_corrupted) and measure its metric (else `corrupted_metric` is nan, for a caller
    whose own corrupted run does that)."""
    if not isinstance(model, nn.Module):
        raise InvalidArgumentTypeError(f"model must be a torch.nn.Module, got {model!r}")
    if not callable(metric):
        raise InvalidArgumentTypeError(f"metric must be callable (output -> number), got {metric!r}")
    kwargs = dict(input_kwargs or {})
    site_list = list(sites) if isinstance(sites, (list, tuple)) else [sites]
    if not site_list:
        raise InvalidOptionError("sites is empty; give a site or a list of sites")
    clean_args, corrupted_args = positional_args(model, clean), positional_args(model, corrupted)
    # One logged pass finds the sites and gives their clean values and the clean output (a
    # hook keeps what forward returned): the values are the ops' own tensors, so saving
    # them all costs the log little. The history keeps none afterwards.
    returned: list = []
    handle = model.register_forward_hook(lambda module, args, output: returned.append(output))
    try:
        probe = log_forward_pass(model, clean, kwargs, random_seed=0)
    finally:
        handle.remove()
    targets = find_targets(probe, site_list)
    clean_values = {t.record.label: t.record.tensor_contents.detach() for t in targets}
    for record in all_passes(probe):
        record.saved = None
    named = list(model.named_modules())
    calls = _call_names(probe)
    clean_metric = number(metric(returned[-1]), "metric(clean output)")
    del returned
    setup = Setup(model, clean_args, corrupted_args, kwargs, targets, clean_values, clean_metric,
                  math.nan, probe, dict(named), None, calls)
    if run_corrupted:
        wanted: dict[int, tuple[int, ...]] = {}
        for target in targets:
            call, index = target.call
            wanted[call] = wanted.get(call, ()) + (index,)
        before = rng_states()
        with torch.no_grad(), model_kept(named):
            corrupted_pass = run_lean(model, corrupted_args, kwargs, wanted)
        setup.is_deterministic = same_states(before, rng_states())
        setup.corrupted_values = {t.record.label: corrupted_pass.saved[t.call] for t in targets
                                  if t.call in corrupted_pass.saved}
        check_corrupted(setup, corrupted_pass.calls,
                        {t.record.label: tuple(corrupted_pass.saved[t.call].shape) for t in targets
                         if t.call in corrupted_pass.saved})
        setup.corrupted_metric = number(metric(corrupted_pass.output), "metric(corrupted output)")
        setup.corrupted_output = corrupted_pass.output
        check_metrics(setup.clean_metric, setup.corrupted_metric)
    return setup


def _call_names(history: ModelHistory) -> list[str]:
    """The op name of each call of the logged pass, in call order, as a lean pass names them."""
    names: list[str] = []
    passes = all_passes(history)
    for op_index, (call, _) in call_positions(passes).items():
        if len(names) < call:
            names.append(passes[op_index].func_name)
    return names


def check_corrupted(setup: Setup, calls: list, shapes: dict[str, tuple[int, ...]]) -> None:
    """Refuse a corrupted run (its `LeanPass.calls` names, and the shapes of its values at
    the sites by pass label) that runs other ops than the clean one before a site, or has
    other shapes there.

    Raises:
        InterventionError: naming the first call or site that differs.
    """
    _check_same_calls(setup.calls, [c for c in call_names(calls) if not isinstance(c, int)], setup.targets)
    for target in setup.targets:
        label = target.record.label
        want, got = tuple(setup.clean_values[label].shape), shapes.get(label)
        if got is not None and want != got:
            raise InterventionError(
                f"site {target.site!r}'s pass {label!r} has shape {want} in the clean run and "
                f"{got} in the corrupted one; patching needs inputs whose runs have the same shapes there")


def find_targets(history: ModelHistory, sites: list) -> list[Target]:
    """The passes the sites name, in site order then execution order, each once.

    Raises:
        InterventionError: a site matches nothing, or names a pass no op made (an input).
    """
    passes = all_passes(history)
    positions = call_positions(passes)
    found: list[Target] = []
    seen: set[int] = set()
    for site in sites:
        check_site(site, "sweep")
        if getattr(site, "stage", None) == "entry":
            raise InterventionError(
                f"site {site!r} names what a module receives, which is not a pass a sweep can patch; "
                "patch the op that made the value (its label), or the module's output before it")
        try:
            indexes = resolve(history, [site])
        except InvalidOptionError:
            indexes = set()
        if not indexes:
            raise InterventionError(f"site {site!r} matches no pass of the clean run")
        if getattr(site, "stage", None) == "op":  # a view's value after a write is no op of its own
            indexes = {i for i in indexes if "view_written_by" not in passes[i].extra}
        for index in sorted(indexes):
            record = acted_on(passes, index, site)  # an op's pass, or refused naming why
            if record.op_index in seen:
                continue
            seen.add(record.op_index)
            found.append(Target(site, record, _module_call(history, record), positions[record.op_index]))
    return found


def _module_call(history: ModelHistory, record: Any) -> tuple[str, int] | None:
    """The innermost module call whose first returned tensor is this pass, if any."""
    for text in record.output_of_modules:
        address, _, call = text.rpartition(":")
        module = history.modules.get(address)
        if module is not None and module.call_outputs[int(call) - 1][:1] == (record.label,):
            return address, int(call)
    return None


def _check_same_calls(names_clean: list[str], names_corrupted: list[str], targets: list[Target]) -> None:
    """Refuse when the corrupted input runs other ops than the clean one before a site."""
    last = max(t.call[0] for t in targets)
    for k in range(last):
        if k >= len(names_corrupted) or names_clean[k] != names_corrupted[k]:
            site = next(t.site for t in targets if t.call[0] > k)
            got = repr(names_corrupted[k]) if k < len(names_corrupted) else "nothing"
            raise InterventionError(
                f"the corrupted input runs other ops than the clean one before site {site!r}: call "
                f"{k + 1} is {names_clean[k]!r} in the clean run and {got} in the corrupted one; "
                "patching needs the same ops up to each site")


def check_positions(setup: Setup, positions: Sequence[int] | None, position_dim: int) -> None:
    if positions is None:
        return
    for target in setup.targets:
        shape = tuple(target.record.tensor_meta.shape)
        if position_dim >= len(shape):
            raise InvalidOptionError(
                f"position_dim={position_dim} but site {target.site!r}'s pass {target.record.label!r} "
                f"has shape {shape}; give the dimension of positions")
        for position in positions:
            if isinstance(position, bool) or not isinstance(position, int) or not -shape[position_dim] <= position < shape[position_dim]:
                raise InvalidOptionError(
                    f"position {position!r} is out of range for site {target.site!r}'s pass "
                    f"{target.record.label!r} of shape {shape} along dimension {position_dim}")


def check_metrics(clean_metric: float, corrupted_metric: float) -> None:
    """Refuse the two unpatched runs' metrics when they leave the normalised effect
    `(metric - corrupted) / (clean - corrupted)` undefined: equal, or not finite. Every row
    would be NaN, so this is checked before any patched run.

    Raises:
        InvalidOptionError: naming both metric values.
    """
    values = f"the clean output and {corrupted_metric!r} on the corrupted one"
    if not (math.isfinite(clean_metric) and math.isfinite(corrupted_metric)):
        raise InvalidOptionError(
            f"metric gives {clean_metric!r} on {values}; effects are normalised by the difference "
            "of the two, which needs finite numbers: make the metric finite on both outputs")
    if clean_metric == corrupted_metric:
        raise InvalidOptionError(
            f"metric gives {clean_metric!r} on {values}: they are equal, so the normalised effect "
            "(metric - corrupted) / (clean - corrupted) does not exist at any site; use a corrupted "
            "input that changes the metric, or a metric that tells the two outputs apart (e.g. a "
            "logit difference)")


def number(value: Any, what: str) -> float:
    """A metric's value as a float.

    Raises:
        InvalidArgumentTypeError: not a number nor a one-element tensor.
    """
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.detach())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise InvalidArgumentTypeError(
        f"{what} gave {value!r:.80} of type {type(value).__name__}; a metric must return a number "
        "(a float or a one-element tensor), e.g. lambda out: out.logits[0, -1, 5] - out.logits[0, -1, 7]")
