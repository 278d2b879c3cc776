"""Checking log_forward_pass's arguments, all before the model runs."""
from __future__ import annotations

import inspect
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from torchlog.capture.options import CaptureOptions
from torchlog.errors import (
    InvalidArgumentTypeError,
    InvalidOptionError,
    ModelInputError,
    TorchlogWarning,
)
from torchlog.gradients import check_gradient_options
from torchlog.seeding import new_seed
from torchlog.selection import check_entries

_ON_ERROR = ("raise", "return")


@dataclass(slots=True)
class Request:
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
    named_modules: list = field(default_factory=list)  # one walk of the model, reused


def validate(model: Any, input_args: Any, input_kwargs: Any, layers_to_save: Any,
             keep_unsaved_layers: Any, output_device: Any, detach_saved_tensors: Any,
             random_seed: Any, activation_postfunc: Any, save_function_args: Any, on_error: Any,
             save_gradients: Any = False) -> Request:
    """Check every argument of log_forward_pass before the model runs.

    Raises:
        InvalidArgumentTypeError, InvalidOptionError, ModelInputError: naming the bad
            value and what is accepted.
    """
    if not isinstance(model, nn.Module):
        raise InvalidArgumentTypeError(
            f"model must be a torch.nn.Module, got {model!r} of type {type(model).__name__}; "
            "wrap a plain function in an nn.Module whose forward calls it")
    named = list(model.named_modules())
    _check_not_meta(named)
    if input_kwargs is None:
        input_kwargs = {}
    if not isinstance(input_kwargs, dict):
        raise InvalidArgumentTypeError(
            f"input_kwargs must be a dict of keyword arguments, got {input_kwargs!r}")
    args = positional_args(model, input_args)
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
    return Request(model, args, input_kwargs, new_seed() if random_seed is None else random_seed,
                   options, check_entries(layers_to_save), keep_unsaved_layers, on_error,
                   save_gradients, named)


def _plugins() -> tuple:
    """Capture plugins for op sources beyond torch functions that this process can use."""
    if "triton" not in sys.modules:  # the model cannot launch kernels: log them at no cost
        return ()
    from torchlog.capture.triton import log_triton_launches

    return (log_triton_launches,)


def _check_not_meta(named_modules: list) -> None:
    for address, module in named_modules:
        tensors = list(module._parameters.items()) + list(module._buffers.items())
        for name, tensor in ((f"{address}.{n}" if address else n, t) for n, t in tensors):
            if tensor is None or not tensor.is_meta:
                continue
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


def positional_args(model: nn.Module, input_args: Any) -> tuple:
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


def check_render_options(options: dict[str, Any]) -> dict[str, Any] | None:
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
