"""The public entry point: `log_forward_pass`, from checked arguments to a ModelHistory."""
from __future__ import annotations

import linecache
import reprlib
import warnings
from collections.abc import Callable
from dataclasses import replace
from time import perf_counter
from typing import Any

import torch
from torch import nn

from torchlog.arguments import Request, check_render_options, prepare
from torchlog.assemble import assemble
from torchlog.capture import CapturedPass, CaptureOptions, Failure, module_table, run_captured, site_text
from torchlog.collector import collector_paused
from torchlog.errors import (
    InvalidOptionError,
    CompiledModelWarning,
    InterventionError,
    closest_matches,
    ModelInputError,
    NondeterministicModelError,
)
from torchlog.gradients import GradientStore, warn_if_no_gradients
from torchlog.history import ModelHistory, RunInfo, all_passes
from torchlog.interventions.records import intervention_records
from torchlog.model_state import compiled_text, eager_submodules, is_compiled, model_kept
from torchlog.optional import require
from torchlog.options import LogOptions, merge_options
from torchlog.records import FailedArg, FailedOp
from torchlog.seeding import seeded
from torchlog.sites.planner import Planner, reached
from torchlog.served import can_serve, metadata_of, served_history
from torchlog.sites.probes import PROBES, signature
from torchlog.sites.resolve import resolve

__all__ = ["log_forward_pass"]


def log_forward_pass(model: nn.Module, input_args: Any, input_kwargs: dict[str, Any] | None = None,
                     *, options: LogOptions | None = None, **keywords: Any) -> ModelHistory:
    """Run `model` on the inputs and record every tensor op into a ModelHistory.

    Args:
        model: the module to run; it is left exactly as it was.
        input_args: a tensor, or a list/tuple of positional arguments. A tuple is passed
            as one argument when forward takes exactly one positional parameter.
        input_kwargs: keyword arguments for forward.
        options: what to keep, as a LogOptions (layers_to_save, random_seed, save_to, ...).
            A list `layers_to_save` keeps exactly the chosen passes, in execution order;
            every list on the history names only the chosen passes (`output_layers` is
            empty unless 'output' is chosen). The model runs once wherever the entries,
            sites and stop can be decided while it runs (see docs/design.md, section 4).
        **keywords: the fields of LogOptions by name, as TorchLens spells them
            (`layers_to_save=['conv2d_3_7']`, `random_seed=0`, ...), overriding `options`;
            and rendering options `vis_opt`, `vis_nesting_depth`, `vis_outpath`, ...
            (see torchlog.vis).

    Returns:
        The ModelHistory of the pass.

    Raises:
        InvalidArgumentTypeError, InvalidOptionError, ModelInputError: bad arguments,
            raised before the model runs; ModelInputError also when forward's first op
            rejects a non-tensor input (chained to the original TypeError).
        Exception: whatever the model raises, unchanged, with a note naming the op and module.
        BaseException: KeyboardInterrupt and SystemExit pass through untouched, with no history.

    Warns:
        CompiledModelWarning: `model` came from torch.compile; its `_orig_mod` is logged.

    Example:
        >>> import torch, torchlog
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> history = torchlog.log_forward_pass(net, torch.rand(2, 4))
        >>> history.layer_labels
        ['input_1_0', 'linear_1_1', 'relu_1_2', 'output_1_3']
        >>> history[2].layer_type
        'relu'
        >>> only_relu = torchlog.LogOptions(layers_to_save=["relu"], random_seed=0)
        >>> only = torchlog.log_forward_pass(net, torch.rand(2, 4), options=only_relu)
        >>> only.layer_labels, only.output_layers
        (['relu_1_2'], [])
    """
    if is_compiled(model):
        warnings.warn(compiled_text(model), CompiledModelWarning, stacklevel=2)
        model = model._orig_mod
    options, render_keywords = merge_options(options, keywords)
    request = prepare(model, input_args, input_kwargs, options)
    compiled = compiled_text(model, request.named_modules)  # compiled submodules
    if compiled is not None:
        warnings.warn(compiled, CompiledModelWarning, stacklevel=2)
    render = check_render_options(render_keywords)
    writer = _open_log_file(request)
    grad_was_enabled = torch.is_grad_enabled()
    history = _log(request) if writer is None else _log_to_file(request, writer)
    if options.save_gradients:
        warn_if_no_gradients(history.info.num_gradient_hooks or 0, grad_was_enabled)
    if render is not None:
        history.render_graph(**render)
    return history


def log_prepared(request: Request) -> ModelHistory:
    """Log a request `torchlog.arguments.prepare` checked, as `log_forward_pass` does once
    its arguments are checked: for callers inside torchlog that set capture options no
    keyword reaches (`torchlog.find_nonfinite` stops the pass at the first NaN or Inf).

    Raises:
        Exception: whatever the model raises, as `log_forward_pass` raises it.
    """
    return _log(request)


def _log(request: Request, gradient_sink: Callable | None = None) -> ModelHistory:
    """`gradient_sink` stores the gradients of the history returned (GradientStore's sink)."""
    started = perf_counter()
    planner = request.acting
    if planner is None:  # the usual call: save everything (or nothing), act on nothing
        return _run(request, request.capture, started, prune=False, gradient_sink=gradient_sink)
    # One pass where everything named can be decided while it runs (guesses are checked
    # on the finished history); a sink streams what it is given, so it gets no guesses.
    # A kept probe for this input signature makes guessing needless: the exact plan runs once,
    # and a plain list of values is served by the lean capture (served.py).
    key = signature(request.model, request.named_modules, request.args, request.kwargs) if planner.guesses else None
    probe = PROBES.get(request.model, key) if key is not None else None
    kept = probe is not None
    if kept and gradient_sink is None and can_serve(request):
        # After misses in a row the model's ops change from call to call: log it in full at once.
        servable = PROBES.servable(request.model, key)
        history = served_history(request, probe, started) if servable else None
        if servable:
            PROBES.served(request.model, key, matched=history is not None)
        if history is not None:
            return history
        PROBES.drop(key)  # the model no longer runs the kept probe's ops: a pass of its own
        kept = False
    if not planner.needs_probe and not kept and (request.capture.sink is None or not planner.guesses):
        capture = replace(request.capture, plan=planner.first_plan(),
                          save_all=request.capture.save_all or planner.save_everything,
                          save_indices=planner.save_indices)
        try:
            return _acted(request, _run(request, capture, started, prune=False, gradient_sink=gradient_sink,
                                        choose=planner.check))
        except _GuessMissed:
            pass  # a loop before a label moved its numbers: resolve on a probe instead
    return _acted(request, _probed(request, planner, started, gradient_sink))


def _probed(request: Request, planner: Planner, started: float, gradient_sink: Callable | None) -> ModelHistory:
    """The pass with its plan resolved on a probe (see `probe_for`; each action runs once
    per firing, in the run returned). A kept probe the run no longer matches is dropped
    and made again, once."""
    nothing = replace(request.capture, save_all=False, save_indices=frozenset())
    for attempt in range(2):
        probe, kept = probe_for(request, started, fresh=attempt > 0)
        entries = planner.entries
        try:
            plan = planner.plan(probe)
            chosen = None if entries is None else (reached(probe, entries) if probe.is_partial
                                                   else resolve(probe, entries))
        except (InterventionError, InvalidOptionError):
            if not kept:
                raise
            continue  # a kept probe the model no longer matches names nothing here: probe again
        capture = replace(request.capture, plan=plan) if entries is None else \
            replace(nothing, save_indices=frozenset(chosen), plan=plan)
        try:
            # A model that raised raises again here (or returns), now with the chosen ops saved.
            return _run(request, capture, started, prune=entries is not None and not request.options.keep_unsaved_layers,
                        expected=probe, gradient_sink=gradient_sink)
        except (InterventionError, NondeterministicModelError) as error:
            if not kept or attempt or not getattr(error, "torchlog_ops_changed", False):
                raise
    raise AssertionError("unreachable")


def probe_for(request: Request, started: float | None = None, fresh: bool = False,
              guess_stop: bool = False) -> tuple[ModelHistory, bool]:
    """The probe of the request's model for its input signature, and whether it was kept
    from an earlier call: the one sites/probes.py keeps (unless `fresh`, which drops it),
    else a new metadata-only pass acting on nothing, stopped where the request's stop is
    decided while it runs (then it is not kept; `guess_stop`: a label's pass guessed by its
    node too), which returns its partial history rather than raise when the model raises.
    """
    key = signature(request.model, request.named_modules, request.args, request.kwargs)
    if fresh:
        PROBES.drop(key)
    probe = PROBES.get(request.model, key)
    if probe is not None:
        return probe, True
    planner = request.acting
    nothing = replace(request.capture, save_all=False, save_indices=frozenset(),
                      plan=None if planner is None else planner.probe_plan(guess_stop))
    probe = _run(request, nothing, perf_counter() if started is None else started, prune=False, on_error="return")
    if not probe.is_partial and probe.stopped_at is None:
        PROBES.put(request.model, key, probe)
    return probe, False


class _GuessMissed(Exception):
    """A first-plan pass guessed a label's node wrong (or saved less than chosen)."""


def _acted(request: Request, history: ModelHistory) -> ModelHistory:
    """`history`, once every intervention site of the request is found to have acted.

    Raises:
        InterventionError: a site never acted in a pass that ran to its end (or to its
            stop); the history is on `exc.torchlog_history`.
    """
    acting = request.acting
    if acting is None or history.is_partial:
        return history
    fired = {record.number for record in history.info.interventions}
    missing = [site for site in acting.sites if site.number not in fired]
    if not missing:
        return history
    stopped = f" before the pass was stopped after {history.stopped_at!r}" if history.stopped_at else ""
    near = closest_matches(str(missing[0].given), history.layer_labels + list(history.modules))
    error = InterventionError(
        f"intervene site {missing[0].given!r} matched no pass of this run{stopped}, so its action "
        f"{missing[0].action!r} was never applied{'; closest: ' + ', '.join(near) if near else ''}"
        + (f" ({len(missing) - 1} more sites did not act either)" if len(missing) > 1 else ""))
    error.torchlog_history = history
    raise error


def _open_log_file(request: Request) -> Any:
    """A torchlog.storage LogWriter wired into the request's capture options, or None
    without save_to."""
    if request.options.save_to is None:
        return None
    writers = require("torchlog.storage.writer", "save_to")  # lazily: h5py is an optional extra
    writer = writers.LogWriter(request.options.save_to, request.options.overwrite)
    writer.describe_run(type(request.model).__name__, request.seed, module_table(request.named_modules))
    request.capture = replace(request.capture, sink=writer.sink, sink_settle=writer.settle,
                              sink_stale=writer.stale)
    return writer


def _log_to_file(request: Request, writer: Any) -> ModelHistory:
    """Run `_log` streaming into `writer`; the file is finished (or marked incomplete) either way."""
    try:
        history = _log(request, writer.gradient_sink)
    except BaseException as exc:
        writer.abort(exc)
        raise
    writer.finish(history)
    return history


def _run(request: Request, capture: CaptureOptions, started: float, prune: bool,
         expected: ModelHistory | None = None, on_error: str | None = None,
         gradient_sink: Callable | None = None, choose: Callable | None = None) -> ModelHistory:
    """One captured pass keeping what `capture` asks for, built into a history; re-raises
    what forward raised (see _partial). With `choose` (a first plan's check), the history
    keeps exactly the saved passes it returns, or `_GuessMissed` is raised when it
    returns None."""
    with collector_paused():
        captured, store = _capture(request, capture, gradient_sink)
        if captured.failure is None:
            history = _build(request, captured, started, prune, store, choose)
        else:
            history = _partial(request, captured, started, prune, store, choose)
    if captured.failure is not None:
        error, captured = captured.failure.error, None  # see _capture: no cycle through this frame
        # An intervention that could not be done is never a history to return quietly.
        if (on_error or request.options.on_error) == "return" and not isinstance(error, InterventionError):
            del error
            return history
        _name_pass(error, history)
        try:
            raise error  # the model's own exception, its traceback intact
        finally:
            del error  # the traceback keeps this frame: it must not keep the error in turn
    if expected is not None and not _same_ops(expected, history):
        if request.acting is not None and request.acting.sites:
            error = InterventionError(
                f"the interventions changed which ops {history.model_name} ran after their sites, "
                "so the layers chosen by layers_to_save in the pass that found them cannot be "
                "found again; save with layers_to_save='all' (or None) when intervening this way")
        else:
            error = NondeterministicModelError(
                f"{history.model_name} ran different ops on two passes with random seed "
                f"{request.seed}, so the layers chosen by layers_to_save cannot be found again; "
                "save with layers_to_save='all' and pick layers from the result instead")
        error.torchlog_ops_changed = True
        raise error
    return history


def _name_pass(error: BaseException, history: ModelHistory) -> None:
    """Add to an action's error the label of the pass it acted on, once the partial history
    has labels (the action ran before they existed): the key a user looks up."""
    index = getattr(error, "torchlog_op_index", None)
    passes = all_passes(history)
    if not isinstance(error, InterventionError) or index is None or not 0 <= index < len(passes):
        return
    label = passes[index].label
    if error.args and f"pass {label!r}" not in str(error.args[0]):
        error.args = (f"{error.args[0]} (pass {label!r})", *error.args[1:])


def _same_ops(expected: ModelHistory, history: ModelHistory) -> bool:
    """Whether `history` ran `expected`'s ops (its first ones only, when it was stopped)."""
    before, now = [p.func_name for p in all_passes(expected)], [p.func_name for p in all_passes(history)]
    if history.stopped_at is not None:
        before = before[:len(now)]
    return before == now


def _capture(request: Request, capture: CaptureOptions,
             gradient_sink: Callable | None) -> tuple[CapturedPass, GradientStore | None]:
    """Run the pass; again, copying, while saved values changed after they were saved.

    Activations are saved as the ops' own tensors, copied just before an op announces a
    write into them; a write nothing announced shows in the version counters at the end
    (`stale_saves`). The pass then runs again from the same seed and model state with
    those ops' values copied, and once more copying everything if other values changed.
    """
    for retry in range(3):
        store = _hook_gradients(request, gradient_sink)
        options = capture if store is None else replace(capture, on_node=store.on_node)
        with seeded(request.seed, numpy=request.options.random_seed is not None), \
                model_kept(request.named_modules), \
                eager_submodules(request.named_modules):
            # KeyboardInterrupt and SystemExit leave at once, unchanged; Exceptions come back.
            captured = run_captured(request.model, request.args, request.kwargs, options,
                                    request.named_modules)
        if not captured.stale_saves or captured.failure is not None:
            break
        stale = capture.copy_indices | frozenset(captured.stale_saves)
        capture = replace(capture, copy_indices=stale) if retry == 0 else replace(capture, copy_all=True)
    try:
        return captured, store
    finally:
        # A failed pass's traceback keeps this frame (through the frames below it): it must
        # not keep the pass, whose failure names the error, in turn, or the error, the
        # partial history and its activations would wait for the cyclic collector.
        del captured


def _partial(request: Request, captured: CapturedPass, started: float, prune: bool,
             store: GradientStore | None, choose: Callable | None = None) -> ModelHistory:
    """The partial history of a pass whose forward raised, set on the error with a note.

    Raises:
        ModelInputError: forward's first op rejected a non-tensor input; chained to the
            model's TypeError, which then carries no history.
    """
    error = captured.failure.error
    bad_input = _input_error(request, captured, error)
    if bad_input is not None:
        raise bad_input from error
    history = _build(request, captured, started, prune, store, choose)
    error.torchlog_history = history
    error.add_note(_failure_note(history))
    return history


def _input_error(request: Request, captured: CapturedPass, exc: Exception) -> ModelInputError | None:
    """A ModelInputError when forward's first op rejected a non-tensor input, else None."""
    if not isinstance(exc, TypeError) or any(node.kind == "op" for node in captured.nodes):
        return None
    odd = [value for value in (*request.args, *request.kwargs.values())
           if not isinstance(value, torch.Tensor)]
    if not odd:
        return None  # every input is a tensor: the TypeError is the model's own
    shown = ", ".join(f"{reprlib.repr(v)} ({type(v).__name__})" for v in odd)
    return ModelInputError(
        f"{type(request.model).__name__}.forward could not take the non-tensor input(s) {shown}: "
        f"{type(exc).__name__}: {exc}. Pass tensors, or the lists/dicts of tensors forward expects")


def _hook_gradients(request: Request, sink: Callable | None) -> GradientStore | None:
    """A fresh GradientStore for one run (its indexes restart), or None without save_gradients."""
    if not request.options.save_gradients:
        return None
    return GradientStore(request.capture.output_device, sink)


def _build(request: Request, captured: CapturedPass, started: float, prune: bool,
           store: GradientStore | None = None, choose: Callable | None = None) -> ModelHistory:
    built = assemble(captured)
    history = _history(request, captured, started, built, built.passes)
    if choose is not None:
        kept = choose(history)
        if kept is None:
            raise _GuessMissed()
        if captured.failure is None and captured.stopped_at is None and can_serve(request):
            # The whole pass's metadata, kept for the next call with these input shapes.
            PROBES.put(request.model, signature(request.model, request.named_modules, request.args,
                                                request.kwargs), metadata_of(history))
        for record in built.passes:
            if record.op_index not in kept:
                record.saved = None  # saved because a rule could not tell it apart: not chosen
        prune = request.acting.entries is not None and not request.options.keep_unsaved_layers
    passes = built.passes
    if prune:
        passes = [p for p in passes if p.saved is not None]
        history = ModelHistory(passes, built.layers, built.modules, history.info)
    if store is not None:
        store.attach(passes)  # pruned passes get no gradient
        history.info.num_gradient_hooks = store.num_hooked
    return history


def _history(request: Request, captured: CapturedPass, started: float, built: Any, passes: list) -> ModelHistory:
    """The history of `built` holding `passes` (all of them, or the saved ones)."""
    info = RunInfo(
        model_name=type(request.model).__name__,
        random_seed=request.seed,
        elapsed_s=perf_counter() - started,
        num_modules=len(built.modules),
        all_passes=built.passes,
        activation_postfunc=_name_of(request.options.activation_postfunc),
    )
    if captured.firings or captured.stopped_at is not None:
        info.interventions = intervention_records(captured.firings, built.passes)
        if captured.stopped_at is not None:
            info.stopped_at = built.passes[captured.stopped_at].label
    if captured.failure is not None:
        info.is_partial = True
        info.failure, info.failed_parents = _describe_failure(captured.failure, built.passes)
        info.error = f"{type(captured.failure.error).__name__}: {captured.failure.error}"
        info.failed_op = _failed_op(captured.failure, built.passes)
    return ModelHistory(passes, built.layers, built.modules, info)


def _name_of(func: Any) -> str | None:
    """A postfunc's name as a log keeps it ('abs', '<lambda>', a callable object's class), or None."""
    if func is None:
        return None
    return getattr(func, "__name__", None) or type(func).__name__


def _describe_failure(failure: Failure, passes: list) -> tuple[str, tuple]:
    """The run's failure text, and the labels of the passes the failing op received."""
    last = passes[-1].label if passes else "nothing"
    where = _module_text(failure.module_path)
    error = type(failure.error).__name__
    if failure.func_name is not None:
        parents = tuple(passes[i].label for i in failure.parent_nodes)
        return f"op {failure.func_name!r} {where} raised {error} (last op logged: {last})", parents
    return f"{error} raised by Python code {where} (last op logged: {last})", ()


def _failed_op(failure: Failure, passes: list) -> FailedOp | None:
    """The torch call that raised, as the history keeps it; None when Python code raised."""
    if failure.func_name is None:
        return None
    site = line = None
    if failure.site is not None:
        code, offset = failure.site
        site, number = site_text(failure.site), code.line_at(offset)
        if number is not None:  # '' when the file cannot be read (code typed at a prompt)
            line = linecache.getline(code.co_filename, number).strip() or None
    args = tuple(FailedArg(slot, shape, dtype, passes[node].label if node is not None else address)
                 for slot, shape, dtype, node, address in failure.args)
    return FailedOp(failure.func_name, site, line, args)


def _module_text(module_path: tuple) -> str:
    if not module_path:
        return "at the model's top level"
    address, call = module_path[-1]
    return f"in module {address!r} (call {call})"


def _failure_note(history: ModelHistory) -> str:
    return (f"torchlog: {history.info.failure}; the partial history is in "
            f"exc.torchlog_history ({len(history)} layers logged)")
