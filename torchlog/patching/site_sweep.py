"""Activation patching sweeps: the clean value of each site (and position) patched into the corrupted run.

The clean input is logged once (the same resolution of sites as `layers_to_save` and
`intervene`), which gives the sites' passes, their clean values and the clean output; the
corrupted input runs once through the lean capture, to check that it runs the same ops up
to each site and to measure its metric. Each patched run is then a plain forward with hooks
on the modules whose outputs are patched, or the lean capture for other ops (`runs.py`);
with `batch_size`, that many patched runs share one forward over the corrupted input
repeated along the batch dimension, row block `i` patching site `i` (the model must treat
batch rows independently, as in eval mode). The calls upstream of a run's first patch are
served from an earlier run's record instead of recomputed (`prefix.py`), and a patch that
writes the values the corrupted run already has there is not run at all.
"""
from __future__ import annotations

import difflib
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from torchlog.api import log_forward_pass
from torchlog.capture import call_names, find_tensors, run_lean, substitute
from torchlog.errors import InterventionError, InvalidOptionError
from torchlog.model_state import model_kept
from torchlog.patching.prefix import Prefix
from torchlog.patching.result import PatchResult, PatchRow
from torchlog.patching.runs import Edit, Target, run_patched
from torchlog.patching.sweep_setup import Setup, check_positions, number, prepare_sweep

__all__ = ["sweep", "module_of"]


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

    A rerun computes only what depends on its patch, where the model draws no random
    numbers: the calls before a run's first patch are served from an earlier run of the
    same inputs (up to 1 GiB of their values is kept for the sweep), and a patch whose
    clean values equal the corrupted run's there (every position before the changed token
    of a causal model) is not run: its row is the corrupted run's.

    Returns:
        A PatchResult, one row per site pass (and position), effect 0 = corrupted, 1 = clean.

    Raises:
        InterventionError: a site matches nothing, or the corrupted input runs other ops before it.
        InvalidArgumentTypeError, InvalidOptionError: a metric that gives no number, positions
            out of range for a site's value, a bad batch_size; InvalidOptionError also when
            the metric is equal (or not finite) on the clean and corrupted outputs, where
            the normalised effect does not exist (raised before any patched run).

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
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise InvalidOptionError(f"batch_size must be None or an int >= 1, got {batch_size!r}")
    setup = prepare_sweep(model, clean, corrupted, sites, metric, input_kwargs)
    patches = [(target, position) for target in setup.targets
               for position in (positions if positions is not None else [None])]
    check_positions(setup, positions, position_dim)
    if engine == "replay":
        return _replayed_sweep(setup, patches, position_dim, metric, progress)
    values = _rerun(setup, patches, position_dim, metric, batch_size, progress)
    rows = [_row(setup, target, position, value) for (target, position), value in zip(patches, values)]
    return PatchResult(rows, setup.clean_metric, setup.corrupted_metric, "sweep", setup.history)


def _rerun(setup: Setup, patches: list, position_dim: int, metric: Callable, batch_size: int | None,
           progress: bool | None) -> list[float]:
    """The metric of each patch, from patched reruns: `batch_size` patches per forward.

    A patch that writes the values already there is the corrupted run itself, and is not
    run. The runs go latest site first: the first one's record of the calls upstream of
    its patch then covers those of every later run (prefix.py).
    """
    values = [setup.corrupted_metric] * len(patches)
    chunk = batch_size or 1
    groups = [[i for i in range(start, min(start + chunk, len(patches)))
               if not _writes_nothing(setup, *patches[i], position_dim)]
              for start in range(0, len(patches), chunk)]
    groups = [group for group in groups if group]
    groups.sort(key=lambda group: -min(patches[i][0].call[0] for i in group))
    bar = _Progress(len(patches), progress)
    bar.update(len(patches) - sum(len(group) for group in groups))
    with torch.no_grad(), model_kept(list(setup.model.named_modules())):
        for group in groups:
            found = _run_group(setup, [patches[i] for i in group], position_dim, metric, batched=batch_size is not None)
            for i, value in zip(group, found):
                values[i] = value
            bar.update(len(group))
    bar.close()
    return values


def _writes_nothing(setup: Setup, target: Target, position: int | None, position_dim: int) -> bool:
    """Whether patching `target` (at `position`) writes the very values the corrupted run
    has there (same dtype, bits and signs): in a model that draws no random numbers, that
    patched run is the corrupted run. Before the changed token of a causal model, every
    position is such a patch."""
    corrupted = setup.corrupted_values.get(target.record.label)
    if corrupted is None or not setup.is_deterministic:
        return False
    clean = setup.clean_values[target.record.label]
    if clean.dtype != corrupted.dtype or clean.shape != corrupted.shape:
        return False
    index = (slice(None),) * position_dim + (position,) if position is not None else ...
    clean, corrupted = clean[index], corrupted[index]
    if not torch.equal(clean, corrupted):
        return False
    return not clean.is_floating_point() or torch.equal(torch.signbit(clean), torch.signbit(corrupted))


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


def _run_group(setup: Setup, group: list, position_dim: int, metric: Callable, batched: bool) -> list[float]:
    """Metric values of the patched runs of `group`, one forward (batched) or one each."""
    lean = any(t.module_call is None for t, _ in group)  # runs with the lean capture make other calls
    if not batched:
        prefix = setup.prefixes.setdefault((None, lean), Prefix())
        return [number(metric(run_patched(setup.model, setup.corrupted, setup.kwargs,
                                          [Edit(t, _patch_fn(setup.clean_values[t.record.label], p, position_dim, None))],
                                          setup.named, prefix)), "metric(output)") for t, p in group]
    size = _batch_of(setup.corrupted)
    args = setup.batched_args.get(len(group))
    if args is None:  # the same objects for every batch: a prefix serves calls on the same arguments
        args = setup.batched_args[len(group)] = _repeat(setup.corrupted, len(group), size)
    moved = _batched_calls(setup, args, len(group)) if lean else {}
    edits = [Edit(_moved(t, moved), _patch_fn(setup.clean_values[t.record.label], p, position_dim,
                                              (i * size, (i + 1) * size)))
             for i, (t, p) in enumerate(group)]
    prefix = setup.prefixes.setdefault((len(group), lean), Prefix())
    output = run_patched(setup.model, args, setup.kwargs, edits, setup.named, prefix)
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


def _row(setup: Setup, target: Target, position: int | None, value: float) -> PatchRow:
    gap = setup.clean_metric - setup.corrupted_metric
    effect = (value - setup.corrupted_metric) / gap  # prepare_sweep refused gap == 0
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
