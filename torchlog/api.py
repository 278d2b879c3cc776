"""The public entry point: `log_forward_pass` and the checks it makes before running."""
from __future__ import annotations

import inspect
import reprlib
import sys
import warnings
from collections.abc import Callable, Iterator
import contextlib
from contextlib import contextmanager
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import torch
from torch import nn

from torchlog.assemble import assemble
from torchlog.capture import CaptureOptions, Recorder, run_captured
from torchlog.errors import (
    TorchlogWarning,
    CompiledModelWarning,
    InvalidArgumentTypeError,
    InvalidOptionError,
    MissingDependencyError,
    ModelInputError,
    NondeterministicModelError,
)
from torchlog.gradients import HOOKED_KEY, GradientStore, check_gradient_options, warn_if_no_gradients
from torchlog.history import ModelHistory, RunInfo
from torchlog.seeding import new_seed, seeded
from torchlog.selection import check_entries, resolve

_ON_ERROR = ("raise", "return")


@dataclass(slots=True)
class _Request:
    """Validated arguments of one log_forward_pass call."""

    model: nn.Module
    args: tuple
    kwargs: dict
    seed: int
    options: CaptureOptions
    entries: list | None  # None = save all; [] = save none
    keep_unsaved: bool
    on_error: str
    save_gradients: bool = False


def log_forward_pass(
    model: nn.Module,
    input_args: Any,
    input_kwargs: dict[str, Any] | None = None,
    layers_to_save: str | list[str | int] | None = "all",
    keep_unsaved_layers: bool = False,
    output_device: str | torch.device = "same",
    detach_saved_tensors: bool = False,
    random_seed: int | None = None,
    activation_postfunc: Callable[[torch.Tensor], Any] | None = None,
    save_function_args: bool = False,
    on_error: str = "raise",
    save_gradients: bool = False,
    save_to: str | None = None,
    overwrite: bool = False,
    **render_options: Any,
) -> ModelHistory:
    """Run `model` on the inputs and record every tensor op into a ModelHistory.

    Args:
        model: the module to run; it is left exactly as it was.
        input_args: a tensor, or a list/tuple of positional arguments. A tuple is passed
            as one argument when forward takes exactly one positional parameter.
        input_kwargs: keyword arguments for forward.
        layers_to_save: 'all', None (metadata only), or a list of labels, module
            addresses, int positions and label substrings.
        keep_unsaved_layers: with a list, also keep the layers not saved (no tensors).
        output_device: 'same', or a device to move saved copies to ('cpu').
        detach_saved_tensors: save copies cut from the autograd graph.
        random_seed: seed for every global RNG during the pass (random when None);
            the RNG states are restored afterwards.
        activation_postfunc: applied to each activation before it is saved.
        save_function_args: keep each op's function and arguments (for replay).
        on_error: 'raise' (default) re-raises the model's exception with the partial
            history attached as `exc.torchlog_history`; 'return' returns the partial history.
        save_gradients: hook every tensor that requires grad, so that a later
            `backward()` from a saved tensor (or `history.log_backward(loss)`) fills each
            pass's `grad_contents`. Needs detach_saved_tensors=False; warns when no
            logged tensor requires grad (torch.no_grad(), frozen model and inputs).
        save_to: an HDF5 file to stream the saved activations into as they are produced
            (needs h5py: `pip install torchlog[storage]`); the history then reads them
            from the file on access, so memory stays bounded. See docs/storage.md.
        overwrite: with save_to, replace an existing file instead of refusing.
        **render_options: `vis_opt`, `vis_nesting_depth`, `vis_outpath`, ... (see torchlog.vis).

    Returns:
        The ModelHistory of the pass.

    Raises:
        InvalidArgumentTypeError, InvalidOptionError, ModelInputError: bad arguments,
            raised before the model runs; ModelInputError also when forward's first op
            rejects a non-tensor input (chained to the original TypeError).
        Whatever the model raises, unchanged, with a note naming the op and module.
        KeyboardInterrupt and SystemExit pass through untouched, with no history.

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
    """
    compiled = _compiled_text(model)
    if compiled is not None:
        warnings.warn(compiled, CompiledModelWarning, stacklevel=2)
        model = model._orig_mod if _is_compiled(model) else model
    request = _validate(model, input_args, input_kwargs, layers_to_save, keep_unsaved_layers,
                        output_device, detach_saved_tensors, random_seed, activation_postfunc,
                        save_function_args, on_error, save_gradients)
    render = _check_render_options(render_options)
    writer = _open_log_file(save_to, overwrite, request)
    grad_was_enabled = torch.is_grad_enabled()
    history = _log(request) if writer is None else _log_to_file(request, writer)
    if save_gradients:
        warn_if_no_gradients(history.info.extra.get(HOOKED_KEY, 0), grad_was_enabled)
    if render is not None:
        history.render_graph(**render)
    return history


def _log(request: _Request) -> ModelHistory:
    started = perf_counter()
    if request.entries is None or request.entries == []:
        request.options.save_all = request.entries is None
        request.options.save_indices = frozenset()
        return _run(request, started, prune=False)
    request.options.save_all = False
    request.options.save_indices = frozenset()
    probe = _run(request, started, prune=False, on_error="return")
    chosen = _reached(probe, request.entries) if probe.is_partial else resolve(probe, request.entries)
    request.options.save_indices = frozenset(chosen)
    # A model that raised raises again here (or returns), now with the chosen ops saved.
    history = _run(request, started, prune=not request.keep_unsaved, expected=probe)
    return history


def _open_log_file(save_to: Any, overwrite: Any, request: _Request) -> Any:
    """A torchlog.storage LogWriter wired into the capture options, or None without save_to."""
    if save_to is None:
        return None
    if not isinstance(overwrite, bool):
        raise InvalidArgumentTypeError(f"overwrite must be True or False, got {overwrite!r}")
    try:
        from torchlog.storage.writer import LogWriter  # lazily: h5py is an optional extra
    except ImportError as exc:
        raise MissingDependencyError(
            f"save_to needs h5py ({exc}); install it with `pip install torchlog[storage]`") from exc
    writer = LogWriter(save_to, overwrite)
    writer.describe_run(type(request.model).__name__, request.seed)
    request.options.sink = writer.sink
    request.options.plugins = request.options.plugins + (writer.attach,)
    return writer


def _log_to_file(request: _Request, writer: Any) -> ModelHistory:
    """Run `_log` streaming into `writer`; the file is finished (or marked incomplete) either way."""
    try:
        history = _log(request)
    except BaseException as exc:
        writer.abort(exc)
        raise
    writer.finish(history)
    return history


def _reached(partial: ModelHistory, entries: list) -> set[int]:
    """Op indexes the entries select among the ops that ran before the model raised."""
    chosen: set[int] = set()
    for entry in entries:
        try:
            chosen |= resolve(partial, [entry])
        except InvalidOptionError:
            continue  # it may name an op after the failure, which never ran: nothing to save
    return chosen


def _run(request: _Request, started: float, prune: bool,
         expected: ModelHistory | None = None, on_error: str | None = None) -> ModelHistory:
    store = _hook_gradients(request)
    with seeded(request.seed), _model_kept(request.model), _eager_submodules(request.model):
        try:
            recorder, _ = run_captured(request.model, request.args, request.kwargs, request.options)
        except Exception as exc:
            recorder = getattr(exc, "torchlog_recorder", None)
            if recorder is None:
                raise
            del exc.torchlog_recorder
            bad_input = _input_error(request, recorder, exc)
            if bad_input is not None:
                raise bad_input from exc
            history = _build(request, recorder, started, prune, exc, store)
            exc.torchlog_history = history
            exc.add_note(_failure_note(history))
            if (on_error or request.on_error) == "return":
                return history
            raise
        except BaseException as exc:  # KeyboardInterrupt, SystemExit: stop at once, unchanged
            if hasattr(exc, "__dict__"):
                exc.__dict__.pop("torchlog_recorder", None)  # it would keep every tensor alive
            raise
    history = _build(request, recorder, started, prune, None, store)
    if expected is not None and [p.func_name for p in expected] != [p.func_name for p in _all(history)]:
        raise NondeterministicModelError(
            f"{history.model_name} ran different ops on two passes with random seed "
            f"{request.seed}, so the layers chosen by layers_to_save cannot be found again; "
            "save with layers_to_save='all' and pick layers from the result instead")
    return history


def _input_error(request: _Request, recorder: Recorder, exc: Exception) -> ModelInputError | None:
    """A ModelInputError when forward's first op rejected a non-tensor input, else None."""
    if not isinstance(exc, TypeError) or any(node.kind == "op" for node in recorder.nodes):
        return None
    odd = [value for value in (*request.args, *request.kwargs.values())
           if not isinstance(value, torch.Tensor)]
    if not odd:
        return None  # every input is a tensor: the TypeError is the model's own
    shown = ", ".join(f"{reprlib.repr(v)} ({type(v).__name__})" for v in odd)
    return ModelInputError(
        f"{type(request.model).__name__}.forward could not take the non-tensor input(s) {shown}: "
        f"{type(exc).__name__}: {exc}. Pass tensors, or the lists/dicts of tensors forward expects")


def _compiled_text(model: Any) -> str | None:
    """The CompiledModelWarning text when `model` or a submodule came from torch.compile."""
    if _is_compiled(model):
        return (f"{type(model._orig_mod).__name__} was compiled with torch.compile; torchlog logs "
                "its original module (model._orig_mod) eagerly, so the history shows eager ops, "
                "not the compiled kernels")
    inner = [a for a, m in model.named_modules() if _is_compiled(m)] if isinstance(model, nn.Module) else []
    if not inner:
        return None
    return (f"submodules {inner!r} were compiled with torch.compile; torchlog runs them eagerly "
            "while logging, so the history shows eager ops, not the compiled kernels")


def _eager_submodules(model: nn.Module) -> contextlib.AbstractContextManager:
    """Run torch.compile'd submodules eagerly: dynamo would otherwise trace torchlog's own hooks.

    The stance is global to the process, so it is only set for models that need it.
    """
    if not any(_is_compiled(m) for m in model.modules()):
        return contextlib.nullcontext()
    return torch.compiler.set_stance("force_eager")


def _is_compiled(model: Any) -> bool:
    """True for the wrapper torch.compile returns (its module is imported once one exists)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    wrapper = getattr(eval_frame, "OptimizedModule", None)
    return wrapper is not None and isinstance(model, wrapper) and isinstance(
        getattr(model, "_orig_mod", None), nn.Module)


@contextmanager
def _model_kept(model: nn.Module) -> Iterator[None]:
    """Undo what forward did to the model's buffers and train/eval flags (BatchNorm stats).

    Each pass then starts from the same state (layers_to_save runs the model twice) and
    the model is left as it was. Parameters changed in place are not undone.
    """
    with torch._C.DisableTorchFunction():  # never logged by an outer log_forward_pass
        kept = [(module, module.training, dict(module._buffers),
                 {name: b.detach().clone() for name, b in module._buffers.items() if b is not None})
                for module in model.modules()]
    try:
        yield
    finally:
        with torch._C.DisableTorchFunction(), torch.no_grad():
            for module, training, buffers, values in kept:
                module.training = training
                current = module._buffers
                # Touch the dict only when forward reassigned a buffer: another thread may
                # be reading it (two threads logging one model).
                if current.keys() != buffers.keys() or any(current[k] is not v for k, v in buffers.items()):
                    current.clear()
                    current.update(buffers)
                for name, copy in values.items():
                    # Kernels such as batch_norm update running stats without bumping
                    # _version, so compare values; copy only what changed.
                    if not torch.equal(buffers[name], copy):
                        # Through .data: the version counter stays put, so autograd can
                        # still backpropagate through the batch_norm that updated it.
                        buffers[name].data.copy_(copy)


def _all(history: ModelHistory) -> list:
    return history.info.extra.get("all_passes", history.passes)


def _hook_gradients(request: _Request) -> GradientStore | None:
    if not request.save_gradients:
        return None
    store = GradientStore(request.options.output_device)  # one per run: indexes restart
    request.options.on_node = store.on_node
    return store


def _build(request: _Request, recorder: Recorder, started: float, prune: bool,
           error: BaseException | None, store: GradientStore | None = None) -> ModelHistory:
    built = assemble(recorder, request.model)
    passes = built.passes
    if prune:
        passes = [p for p in passes if p.saved is not None]
    info = RunInfo(
        model_name=type(request.model).__name__,
        random_seed=request.seed,
        elapsed_s=perf_counter() - started,
        num_modules=len(built.modules),
    )
    info.extra["all_passes"] = built.passes
    if store is not None:
        store.attach(passes)  # pruned passes get no gradient
        info.extra[HOOKED_KEY] = store.num_hooked
    if error is not None:
        info.is_partial = True
        info.failure, info.failed_parents = _describe_failure(recorder, built.passes, error)
    return ModelHistory(passes, built.layers, built.modules, info)


def _describe_failure(recorder: Recorder, passes: list, error: BaseException) -> tuple[str, tuple]:
    failure = recorder.failure
    last = passes[-1].label if passes else "nothing"
    if failure is not None:
        where = _module_text(failure.module_path)
        parents = tuple(passes[i].label for i in failure.parent_nodes)
        return (f"op {failure.func_name!r} {where} raised {type(error).__name__} "
                f"(last op logged: {last})", parents)
    where = _module_text(recorder.error_stack or ())
    return f"{type(error).__name__} raised by Python code {where} (last op logged: {last})", ()


def _module_text(module_path: tuple) -> str:
    if not module_path:
        return "at the model's top level"
    address, call = module_path[-1]
    return f"in module {address!r} (call {call})"


def _failure_note(history: ModelHistory) -> str:
    return (f"torchlog: {history.info.failure}; the partial history is in "
            f"exc.torchlog_history ({len(history)} layers logged)")


# ----- validation -------------------------------------------------------------------------------
def _validate(model, input_args, input_kwargs, layers_to_save, keep_unsaved_layers, output_device,
              detach_saved_tensors, random_seed, activation_postfunc, save_function_args,
              on_error, save_gradients=False) -> _Request:
    if not isinstance(model, nn.Module):
        raise InvalidArgumentTypeError(
            f"model must be a torch.nn.Module, got {model!r} of type {type(model).__name__}; "
            "wrap a plain function in an nn.Module whose forward calls it")
    _check_not_meta(model)
    if input_kwargs is None:
        input_kwargs = {}
    if not isinstance(input_kwargs, dict):
        raise InvalidArgumentTypeError(
            f"input_kwargs must be a dict of keyword arguments, got {input_kwargs!r}")
    args = _positional_args(model, input_args)
    _check_binds(model, args, input_kwargs)
    for name, value in (("keep_unsaved_layers", keep_unsaved_layers),
                        ("detach_saved_tensors", detach_saved_tensors),
                        ("save_function_args", save_function_args),
                        ("save_gradients", save_gradients)):
        if not isinstance(value, bool):
            raise InvalidArgumentTypeError(f"{name} must be True or False, got {value!r}")
    if random_seed is not None and (isinstance(random_seed, bool) or not isinstance(random_seed, int)):
        raise InvalidArgumentTypeError(
            f"random_seed must be None or an int in [0, 2**63), got {random_seed!r} of type "
            f"{type(random_seed).__name__}")
    if random_seed is not None and not 0 <= random_seed < 2**63:
        raise InvalidOptionError(
            f"random_seed must be None or an int in [0, 2**63), got {random_seed!r}")
    if activation_postfunc is not None and not callable(activation_postfunc):
        raise InvalidArgumentTypeError(
            f"activation_postfunc must be callable (tensor -> tensor) or None, got {activation_postfunc!r}")
    if on_error not in _ON_ERROR:
        raise InvalidOptionError(f"on_error must be one of {_ON_ERROR}, got {on_error!r}")
    check_gradient_options(save_gradients, detach_saved_tensors)
    options = CaptureOptions(detach=detach_saved_tensors, output_device=_device(output_device),
                             postfunc=activation_postfunc, save_function_args=save_function_args,
                             plugins=_plugins())
    return _Request(model, args, input_kwargs, new_seed() if random_seed is None else random_seed,
                    options, check_entries(layers_to_save), keep_unsaved_layers, on_error,
                    save_gradients)


def _plugins() -> tuple:
    """Capture plugins for op sources beyond torch functions that this process can use."""
    if "triton" not in sys.modules:  # the model cannot launch kernels: log them at no cost
        return ()
    from torchlog.triton_ops import log_triton_launches

    return (log_triton_launches,)


def _check_not_meta(model: nn.Module) -> None:
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if tensor.is_meta:
            raise ModelInputError(
                f"model parameter or buffer {name!r} is on the meta device and holds no values; "
                "materialise the model first (model.to_empty(device='cpu') and load weights)")


def _device(value: Any) -> torch.device | None:
    if isinstance(value, str) and value == "same":
        return None
    accepted = "'same' or an available torch device such as 'cpu' or 'cuda:0'"
    if isinstance(value, bool) or not isinstance(value, (str, int, torch.device)):
        raise InvalidArgumentTypeError(
            f"output_device must be {accepted}, got {value!r} of type {type(value).__name__}")
    try:
        device = torch.device(value)
        if device.type != "cpu":  # fail now, not halfway through the forward pass
            with torch._C.DisableTorchFunction():
                torch.empty(0, device=device)
    except (RuntimeError, TypeError, AssertionError) as exc:  # torch's "not compiled with CUDA" is an AssertionError
        raise InvalidOptionError(f"output_device must be {accepted}, got {value!r}: {exc}") from exc
    if device.type == "meta":
        raise InvalidOptionError(
            f"output_device must be {accepted}, got {value!r}: meta tensors hold no values")
    return device


def _forward_params(model: nn.Module) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):  # builtins or C extensions: nothing to inspect
        return None


def _positional_args(model: nn.Module, input_args: Any) -> tuple:
    if isinstance(input_args, (list, tuple)):
        params = _forward_params(model)
        if params is not None and len(input_args) != 1:
            positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            required = [p for p in positional if p.default is p.empty]
            spread = any(p.kind == p.VAR_POSITIONAL for p in params)
            if not spread and len(positional) >= 1 and len(required) <= 1 and len(input_args) > len(positional):
                return (input_args,)  # forward takes one tuple/list argument: do not spread it
        return tuple(input_args)
    if input_args is None:
        raise ModelInputError(
            "input_args is None; pass a tensor, or a list/tuple of forward's positional arguments")
    return (input_args,)


def _check_binds(model: nn.Module, args: tuple, kwargs: dict) -> None:
    params = _forward_params(model)
    if params is None:
        return
    try:
        inspect.signature(model.forward).bind(*args, **kwargs)
    except TypeError as exc:
        names = ", ".join(p.name for p in params) or "no arguments"
        raise ModelInputError(
            f"{type(model).__name__}.forward({names}) cannot take {len(args)} positional "
            f"argument(s) and keywords {sorted(kwargs)!r}: {exc}") from None


def _check_render_options(options: dict[str, Any]) -> dict[str, Any] | None:
    if not options:
        return None
    unknown = [k for k in options if not k.startswith("vis_")]
    if unknown:
        raise InvalidArgumentTypeError(
            f"log_forward_pass() got unexpected keyword argument(s) {unknown!r}; rendering "
            "options start with 'vis_' (vis_opt, vis_nesting_depth, vis_outpath, vis_fileformat)")
    vis_opt = options.get("vis_opt", "none")
    if vis_opt == "none":
        if len(options) > ("vis_opt" in options):
            warnings.warn(
                f"rendering options {sorted(k for k in options if k != 'vis_opt')!r} are ignored "
                "because vis_opt is 'none'; pass vis_opt='unrolled' or 'rolled' to render",
                TorchlogWarning, stacklevel=3)
        return None
    from torchlog.vis import options_from_keywords  # lazily: graphviz is optional

    return {"options": options_from_keywords(**options)}
