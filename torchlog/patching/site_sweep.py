"""Activation patching sweeps: the clean value of each site (and position) patched into the corrupted run.

The clean input is logged once without values to find the sites' passes (the same
resolution as `layers_to_save` and `intervene`), once more saving only those passes; the
corrupted input is logged once without values to check that it runs the same ops up to
each site. Each patched run is then a plain forward with hooks on the modules whose
outputs are patched, or the lean capture for other ops (`runs.py`); with `batch_size`,
that many patched runs share one forward over the corrupted input repeated along the batch
dimension, row block `i` patching site `i` (the model must treat batch rows independently,
as in eval mode).
"""
from __future__ import annotations

import difflib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from torchlog.api import log_forward_pass
from torchlog.arguments import positional_args
from torchlog.capture.lean import call_names, run_lean
from torchlog.capture.nesting import find_tensors
from torchlog.capture.plan import substitute
from torchlog.errors import InterventionError, InvalidArgumentTypeError, InvalidOptionError
from torchlog.history import ModelHistory, all_passes
from torchlog.model_state import model_kept
from torchlog.patching.result import PatchResult, PatchRow
from torchlog.patching.runs import Edit, Target, run_patched
from torchlog.records import NodeKind
from torchlog.select import Selector
from torchlog.selection import call_positions, resolve

__all__ = ["sweep", "find_targets", "module_of", "Setup"]


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
    corrupted_metric: float
    history: ModelHistory  # the clean run, metadata only
    named: dict[str, nn.Module]
    corrupted_output: Any = None  # what forward returned for the corrupted input
    calls: list = field(default_factory=list)  # the clean run's op names, one per call
    batched_calls: dict = field(default_factory=dict)  # rows -> {unbatched call: batched call}


def sweep(model: nn.Module, clean: Any, corrupted: Any, sites: Any, metric: Callable[[Any], Any], *,
          positions: Sequence[int] | None = None, position_dim: int = 1, batch_size: int | None = None,
          input_kwargs: dict | None = None, progress: bool | None = None,
          engine: str = "rerun") -> PatchResult:
    """Patch each site's clean value (at each position) into the corrupted run; measure `metric`.

    Args:
        model: the model; left exactly as it was.
        clean: the input whose values are patched in (as `log_forward_pass` takes it).
        corrupted: the input of the runs patched; it must run the same op sequence.
        sites: a site or a list of sites as `intervene` takes them (labels, module addresses,
            positions, selectors); each pass a site names is one row (per position).
        metric: output -> a number (a float or a one-element tensor), e.g. a logit difference.
        positions: positions along `position_dim` patched one at a time (None: whole values).
        position_dim: the dimension of positions in every site's value (1: tokens of (B, T, H)).
        batch_size: patched runs per forward (None: one forward each); needs batch-first
            values at every site and a model whose batch rows are independent.
        input_kwargs: keyword arguments for forward, for both inputs.
        progress: show a tqdm bar (None: when the sweep takes longer than a second).
        engine: 'rerun' (run the model once per patched run, or per batch) or 'replay'
            (log the corrupted run once with its function arguments and recompute, per
            patch, only the ops downstream of the site from saved values:
            torchlog.replay.replay; the metric gets the model's output structure with the
            replayed values). Replay equals a rerun where control flow does not depend on
            values.

    Returns:
        A PatchResult, one row per site pass (and position), effect 0 = corrupted, 1 = clean.

    Raises:
        InterventionError: a site matches nothing, or the corrupted input runs other ops before it.
        InvalidArgumentTypeError, InvalidOptionError: a metric that gives no number, positions
            out of range for a site's value, a bad batch_size.

    Example:
        >>> import torch, torchlog
        >>> _ = torch.manual_seed(0)
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
        >>> result = torchlog.patching.sweep(net, torch.ones(1, 2), torch.zeros(1, 2), ['0', '1'],
        ...                                  lambda out: out.sum(), progress=False)
        >>> [round(row.effect, 6) for row in result]  # either layer carries all of the difference
        [1.0, 1.0]
    """
    if engine not in ("rerun", "replay"):
        raise InvalidOptionError(f"engine must be 'rerun' or 'replay', got {engine!r}")
    if engine == "replay" and batch_size is not None:
        raise InvalidOptionError("engine='replay' recomputes one patch at a time; leave batch_size=None")
    setup = prepare_sweep(model, clean, corrupted, sites, metric, input_kwargs)
    patches = [(target, position) for target in setup.targets
               for position in (positions if positions is not None else [None])]
    _check_positions(setup, positions, position_dim)
    if engine == "replay":
        return _replayed_sweep(setup, patches, position_dim, metric, progress)
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise InvalidOptionError(f"batch_size must be None or an int >= 1, got {batch_size!r}")
    rows: list[PatchRow] = []
    chunk = batch_size or 1
    bar = _Progress(len(patches), progress)
    with torch.no_grad(), model_kept(list(model.named_modules())):
        for start in range(0, len(patches), chunk):
            group = patches[start:start + chunk]
            values = _run_group(setup, group, position_dim, metric, batched=batch_size is not None)
            for (target, position), value in zip(group, values):
                rows.append(_row(setup, target, position, value))
            bar.update(len(group))
    bar.close()
    return PatchResult(rows, setup.clean_metric, setup.corrupted_metric, "sweep", setup.history)


def prepare_sweep(model: nn.Module, clean: Any, corrupted: Any, sites: Any,
                  metric: Callable[[Any], Any], input_kwargs: dict | None) -> Setup:
    """Resolve the sites on the clean run, save their clean values, check the corrupted run's
    ops, and measure both runs' metric."""
    if not isinstance(model, nn.Module):
        raise InvalidArgumentTypeError(f"model must be a torch.nn.Module, got {model!r}")
    if not callable(metric):
        raise InvalidArgumentTypeError(f"metric must be callable (output -> number), got {metric!r}")
    kwargs = dict(input_kwargs or {})
    site_list = list(sites) if isinstance(sites, (list, tuple)) else [sites]
    if not site_list:
        raise InvalidOptionError("sites is empty; give a site or a list of sites")
    probe = log_forward_pass(model, clean, kwargs, layers_to_save=None, random_seed=0)
    targets = find_targets(probe, site_list)
    clean_args, corrupted_args = positional_args(model, clean), positional_args(model, corrupted)
    # The clean values and both metrics from two lean passes (not logged passes): a lean
    # pass counts calls as capture numbers them and copies the chosen outputs.
    wanted: dict[int, tuple[int, ...]] = {}
    for target in targets:
        call, index = target.call
        wanted[call] = wanted.get(call, ()) + (index,)
    named = list(model.named_modules())
    with torch.no_grad(), model_kept(named):
        clean_pass = run_lean(model, clean_args, kwargs, wanted)
        corrupted_pass = run_lean(model, corrupted_args, kwargs, wanted)
    clean_values = {t.record.label: clean_pass.saved[t.call] for t in targets}
    calls = [c for c in call_names(clean_pass.calls) if not isinstance(c, int)]
    _check_same_calls(probe, call_names(clean_pass.calls), call_names(corrupted_pass.calls), targets)
    for target in targets:
        want, got = tuple(clean_values[target.record.label].shape), tuple(corrupted_pass.saved[target.call].shape)
        if want != got:
            raise InterventionError(
                f"site {target.site!r}'s pass {target.record.label!r} has shape {want} in the clean run and "
                f"{got} in the corrupted one; patching needs inputs whose runs have the same shapes there")
    clean_metric = number(metric(clean_pass.output), "metric(clean output)")
    corrupted_metric = number(metric(corrupted_pass.output), "metric(corrupted output)")
    return Setup(model, clean_args, corrupted_args, kwargs, targets, clean_values, clean_metric,
                 corrupted_metric, probe, dict(named), corrupted_pass.output, calls)


def _replayed_sweep(setup: Setup, patches: list, position_dim: int, metric: Callable,
                    progress: bool | None) -> PatchResult:
    """The sweep by replay: one logged corrupted run, each patch recomputed downstream of its site."""
    from torchlog.replay.counterfactual import replay  # replay sits beside patching

    logged = log_forward_pass(setup.model, setup.corrupted, setup.kwargs, save_function_args=True,
                              random_seed=0)
    template = setup.corrupted_output
    returned = [t for t, _ in find_tensors(template)]
    rows: list[PatchRow] = []
    bar = _Progress(len(patches), progress)
    with torch.no_grad():
        for target, position in patches:
            fn = _patch_fn(setup.clean_values[target.record.label], position, position_dim, None)
            new = replay(logged, {target.record.label: lambda value, firing, fn=fn: fn(value)})
            output = template
            for old, label in zip(returned, new.output_layers):
                output = substitute(output, old, new[label].tensor_contents)
            rows.append(_row(setup, target, position, number(metric(output), "metric(output)")))
            bar.update(1)
    bar.close()
    return PatchResult(rows, setup.clean_metric, setup.corrupted_metric, "sweep", setup.history)


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
        if not isinstance(site, (str, int, Selector)) or isinstance(site, bool):
            raise InvalidArgumentTypeError(
                f"site {site!r} of type {type(site).__name__} is not accepted; a site is a label, a "
                "module address, an int position or a torchlog.select selector")
        try:
            indexes = resolve(history, [site])
        except Exception:
            indexes = set()
        if not indexes:
            raise InterventionError(f"site {site!r} matches no pass of the clean run")
        for index in sorted(indexes):
            record = passes[index]
            if record.kind == NodeKind.OUTPUT:
                record = history[record.parents[0].label]
            if record.kind not in (NodeKind.OP, NodeKind.CREATED) or record.op_index not in positions:
                raise InterventionError(
                    f"site {site!r} names pass {record.label!r}, a {record.kind.value} tensor no op "
                    "made; patch the op that uses it, or the input itself")
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


def _check_same_calls(probe: ModelHistory, clean: list, corrupted: list, targets: list[Target]) -> None:
    """Refuse when the corrupted input runs other ops than the clean one before a site."""
    last = max(t.call[0] for t in targets)
    # A call list holds a name per call and, after a multi-output call, its count.
    names_clean = [c for c in clean if not isinstance(c, int)]
    names_corrupted = [c for c in corrupted if not isinstance(c, int)]
    for k in range(last):
        if k >= len(names_corrupted) or names_clean[k] != names_corrupted[k]:
            site = next(t.site for t in targets if t.call[0] > k)
            got = repr(names_corrupted[k]) if k < len(names_corrupted) else "nothing"
            raise InterventionError(
                f"the corrupted input runs other ops than the clean one before site {site!r}: call "
                f"{k + 1} is {names_clean[k]!r} in the clean run and {got} in the corrupted one; "
                "patching needs the same ops up to each site")


def _check_positions(setup: Setup, positions: Sequence[int] | None, position_dim: int) -> None:
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


def _run_group(setup: Setup, group: list, position_dim: int, metric: Callable, batched: bool) -> list[float]:
    """Metric values of the patched runs of `group`, one forward (batched) or one each."""
    if not batched:
        return [number(metric(run_patched(setup.model, setup.corrupted, setup.kwargs,
                                          [Edit(t, _patch_fn(setup.clean_values[t.record.label], p, position_dim, None))],
                                          setup.named)), "metric(output)") for t, p in group]
    size = _batch_of(setup.corrupted)
    args = _repeat(setup.corrupted, len(group), size)
    moved = _batched_calls(setup, args, len(group))
    edits = [Edit(_moved(t, moved), _patch_fn(setup.clean_values[t.record.label], p, position_dim,
                                              (i * size, (i + 1) * size)))
             for i, (t, p) in enumerate(group)]
    output = run_patched(setup.model, args, setup.kwargs, edits, setup.named)
    return [number(metric(_rows(output, i * size, (i + 1) * size, len(group) * size)), "metric(output)")
            for i in range(len(group))]


def _batched_calls(setup: Setup, args: tuple, rows: int) -> dict[int, int]:
    """Call number in the unbatched run -> call number in a forward over `rows` repeats of
    the corrupted input: a model may run other ops for a larger batch (transformers expand
    position ids once the batch has several rows), so the calls are aligned by name, as
    difflib aligns two sequences; cached per number of rows."""
    found = setup.batched_calls.get(rows)
    if found is None:
        with model_kept(list(setup.model.named_modules())):
            batched = [c for c in call_names(run_lean(setup.model, args, setup.kwargs, {}).calls)
                       if not isinstance(c, int)]
        found = {}
        matcher = difflib.SequenceMatcher(None, setup.calls, batched, autojunk=False)
        for a, b, n in matcher.get_matching_blocks():
            found.update((a + k + 1, b + k + 1) for k in range(n))
        setup.batched_calls[rows] = found
    return found


def _moved(target: Target, moved: dict[int, int]) -> Target:
    """`target` with its op's call number in the batched run (module outputs need none).

    Raises:
        InterventionError: the batched run has no call matching the target's.
    """
    if target.module_call is not None:
        return target
    call, index = target.call
    if call not in moved:
        raise InterventionError(
            f"with batch_size, the model runs other ops around site {target.site!r} "
            f"({target.record.label!r}) than for one input, so its op cannot be found in the "
            "batched forward; use batch_size=None for this site")
    return Target(target.site, target.record, None, (moved[call], index))


def _patch_fn(clean: torch.Tensor, position: int | None, position_dim: int,
              rows: tuple[int, int] | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """value -> value with the clean value written in (at `position`, in row block `rows`)."""
    index: tuple = ()
    if position is not None:
        index = (slice(None),) * position_dim + (position,)
    source = clean[index] if index else clean

    def patch(value: torch.Tensor) -> torch.Tensor:
        target = value if rows is None else value[rows[0]:rows[1]]
        if tuple(target.shape) != tuple(clean.shape):
            raise InterventionError(
                f"the clean value of shape {tuple(clean.shape)} does not fit the corrupted run's value of "
                f"shape {tuple(target.shape)}" + ("; with batch_size the site's values must have the batch "
                                                   "first" if rows is not None else ""))
        new = value.clone()
        if rows is None:
            new[index if index else ...] = source.to(value.dtype)
        else:
            new[(slice(rows[0], rows[1]),) + index[1:] if index else slice(rows[0], rows[1])] = source.to(value.dtype)
        return new

    return patch


def _batch_of(args: tuple) -> int:
    tensors = [t for t, _ in find_tensors(args)]
    if not tensors or tensors[0].dim() == 0:
        raise InvalidOptionError("batch_size needs a tensor input with a batch dimension first")
    return tensors[0].shape[0]


def _repeat(args: tuple, times: int, size: int) -> tuple:
    """The inputs with every batch-first tensor repeated `times` times along dimension 0."""
    def grow(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.repeat(times, *([1] * (value.dim() - 1))) if value.dim() and value.shape[0] == size else value
        if isinstance(value, (list, tuple)):
            return type(value)(grow(v) for v in value)
        if isinstance(value, dict):
            return {k: grow(v) for k, v in value.items()}
        return value

    return grow(args)


def _rows(output: Any, start: int, stop: int, total: int) -> Any:
    """`output` with every tensor of `total` rows cut to rows [start, stop)."""
    if isinstance(output, torch.Tensor):
        return output[start:stop] if output.dim() and output.shape[0] == total else output
    if isinstance(output, (list, tuple)) and not hasattr(output, "_fields"):
        return type(output)(_rows(v, start, stop, total) for v in output)
    if isinstance(output, dict):
        cut = {k: _rows(v, start, stop, total) for k, v in output.items()}
        try:
            return type(output)(**cut)
        except TypeError:
            return cut
    return output


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


def _row(setup: Setup, target: Target, position: int | None, value: float) -> PatchRow:
    gap = setup.clean_metric - setup.corrupted_metric
    effect = (value - setup.corrupted_metric) / gap if gap != 0 else math.nan
    return PatchRow(target.site, target.record.label, module_of(target.record), position, value, effect)


def module_of(record: Any) -> str:
    """The module a pass belongs to in a table: the outermost module call it is the output
    of, else the innermost module running it ('' at the top level)."""
    if record.output_of_modules:
        return record.output_of_modules[-1].rpartition(":")[0]
    return record.containing_modules[0].rpartition(":")[0] if record.containing_modules else ""


class _Progress:
    """A tqdm bar once the sweep has run a second (or at once with progress=True)."""

    def __init__(self, total: int, progress: bool | None) -> None:
        self.total, self.progress, self.done = total, progress, 0
        self.started = time.perf_counter()
        self.bar: Any = None

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is None and self.progress is not False and (
                self.progress or time.perf_counter() - self.started > 1.0) and self.done < self.total:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                self.progress = False
                return
            self.bar = tqdm(total=self.total, initial=self.done, unit="run", desc="patching")
        elif self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
