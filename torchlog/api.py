"""The public entry point: `log_forward_pass` and the checks it makes before running."""
from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import torch
from torch import nn

from torchlog.assemble import assemble
from torchlog.capture import CaptureOptions, Recorder, run_captured
from torchlog.errors import (
    InvalidArgumentTypeError,
    InvalidOptionError,
    ModelInputError,
    NondeterministicModelError,
)
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
        **render_options: `vis_opt`, `vis_nesting_depth`, `vis_outpath`, ... (see torchlog.vis).

    Returns:
        The ModelHistory of the pass.

    Raises:
        InvalidArgumentTypeError, InvalidOptionError, ModelInputError: bad arguments,
            raised before the model runs.
        Whatever the model raises, unchanged, with a note naming the op and module.

    Example:
        >>> import torch, torchlog
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> history = torchlog.log_forward_pass(net, torch.rand(2, 4))
        >>> history.layer_labels
        ['input_1_0', 'linear_1_1', 'relu_1_2', 'output_1_3']
        >>> history[2].layer_type
        'relu'
    """
    request = _validate(model, input_args, input_kwargs, layers_to_save, keep_unsaved_layers,
                        output_device, detach_saved_tensors, random_seed, activation_postfunc,
                        save_function_args, on_error)
    render = _check_render_options(render_options)
    history = _log(request)
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
    probe = _run(request, started, prune=False)
    if probe.is_partial:
        return probe
    request.options.save_indices = frozenset(resolve(probe, request.entries))
    history = _run(request, started, prune=not request.keep_unsaved, expected=probe)
    return history


def _run(request: _Request, started: float, prune: bool,
         expected: ModelHistory | None = None) -> ModelHistory:
    with seeded(request.seed):
        try:
            recorder, _ = run_captured(request.model, request.args, request.kwargs, request.options)
        except Exception as exc:
            recorder = getattr(exc, "torchlog_recorder", None)
            if recorder is None:
                raise
            del exc.torchlog_recorder
            history = _build(request, recorder, started, prune, exc)
            exc.torchlog_history = history
            exc.add_note(_failure_note(history))
            if request.on_error == "return":
                return history
            raise
    history = _build(request, recorder, started, prune, None)
    if expected is not None and [p.func_name for p in expected] != [p.func_name for p in _all(history)]:
        raise NondeterministicModelError(
            f"{history.model_name} ran different ops on two passes with random seed "
            f"{request.seed}, so the layers chosen by layers_to_save cannot be found again; "
            "save with layers_to_save='all' and pick layers from the result instead")
    return history


def _all(history: ModelHistory) -> list:
    return history.info.extra.get("all_passes", history.passes)


def _build(request: _Request, recorder: Recorder, started: float, prune: bool,
           error: BaseException | None) -> ModelHistory:
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
              on_error) -> _Request:
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
                        ("save_function_args", save_function_args)):
        if not isinstance(value, bool):
            raise InvalidArgumentTypeError(f"{name} must be True or False, got {value!r}")
    if random_seed is not None and (isinstance(random_seed, bool) or not isinstance(random_seed, int)
                                    or not 0 <= random_seed < 2**63):
        raise InvalidOptionError(
            f"random_seed must be None or an int in [0, 2**63), got {random_seed!r}")
    if activation_postfunc is not None and not callable(activation_postfunc):
        raise InvalidArgumentTypeError(
            f"activation_postfunc must be callable (tensor -> tensor) or None, got {activation_postfunc!r}")
    if on_error not in _ON_ERROR:
        raise InvalidOptionError(f"on_error must be one of {_ON_ERROR}, got {on_error!r}")
    options = CaptureOptions(detach=detach_saved_tensors, output_device=_device(output_device),
                             postfunc=activation_postfunc, save_function_args=save_function_args)
    return _Request(model, args, input_kwargs, new_seed() if random_seed is None else random_seed,
                    options, check_entries(layers_to_save), keep_unsaved_layers, on_error)


def _check_not_meta(model: nn.Module) -> None:
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if tensor.is_meta:
            raise ModelInputError(
                f"model parameter or buffer {name!r} is on the meta device and holds no values; "
                "materialise the model first (model.to_empty(device='cpu') and load weights)")


def _device(value: Any) -> torch.device | None:
    if isinstance(value, str) and value == "same":
        return None
    try:
        return torch.device(value)
    except (RuntimeError, TypeError) as exc:
        raise InvalidOptionError(
            f"output_device must be 'same' or a torch device such as 'cpu' or 'cuda:0', "
            f"got {value!r}") from exc


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
        return None
    from torchlog.vis import options_from_keywords  # lazily: graphviz is optional

    return {"options": options_from_keywords(**options)}
