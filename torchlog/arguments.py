"""Checking the model and inputs of log_forward_pass before it runs, and the state of one call."""
from __future__ import annotations

import inspect
import sys
import types
import weakref
import warnings
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from torch import nn

from torchlog.capture import CaptureOptions
from torchlog.errors import InvalidArgumentTypeError, ModelInputError, TorchlogWarning
from torchlog.sites.entries import check_intervene
from torchlog.sites.planner import Planner
from torchlog.options import LogOptions
from torchlog.seeding import new_seed

__all__ = ["Request", "prepare", "positional_args", "check_render_options"]


@dataclass(slots=True)
class Request:
    """One log_forward_pass call, checked: the user's options and the state of this run.

    The user's LogOptions stays as given (it is frozen); what one run adds to it (the
    seed it drew, the entries to resolve, the capture options with the log file's sink
    and the plugins) lives here, private to the call.
    """

    model: nn.Module
    args: tuple
    kwargs: dict
    options: LogOptions  # as the user gave them, keywords merged in
    seed: int  # options.random_seed, or one drawn for this call
    entries: list | None  # layers_to_save: None = save all; [] = save none
    capture: CaptureOptions  # what every pass of this call keeps, before selection
    named_modules: list = field(default_factory=list)  # one walk of the model, reused
    # The saves (a layers_to_save list), intervene and stop_after against this model; None
    # when the call names none of them.
    acting: Planner | None = None


def prepare(model: Any, input_args: Any, input_kwargs: Any, options: LogOptions) -> Request:
    """Check the model and its inputs before it runs, and set up the run `options` ask for.

    Raises:
        InvalidArgumentTypeError, ModelInputError: naming the bad value and what is accepted.
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
    # Saving everything (no layers_to_save list) is set here: the usual call then runs
    # with these capture options as they are.
    entries = options.entries
    capture = CaptureOptions(save_all=entries is None, save_indices=frozenset(),
                             detach=options.detach_saved_tensors, output_device=options.device,
                             postfunc=options.activation_postfunc,
                             save_function_args=options.save_function_args, plugins=_plugins(),
                             profile=options.profile)
    seed = new_seed() if options.random_seed is None else options.random_seed
    acting = None
    if entries or options.intervene is not None or options.stop_after is not None:
        acting = Planner(entries, check_intervene(options.intervene), options.stop_after, named)
    return Request(model, args, input_kwargs, options, seed, entries, capture, named, acting)


def _plugins() -> tuple:
    """Capture plugins for op sources beyond torch functions that this process can use."""
    if "triton" not in sys.modules:  # the model cannot launch kernels: log them at no cost
        return ()
    from torchlog.capture import log_triton_launches

    return (log_triton_launches,)


def _check_not_meta(named_modules: list) -> None:
    """Refuse a model with a parameter or buffer on the meta device, which holds no values,
    unless an accelerate hook on its module (or one above) loads it for each call
    (capture/offload.py logs such a model with the weights the hook loads).

    Raises:
        ModelInputError: naming the first such tensor.
    """
    offloaded: tuple[str, ...] | None = None  # found at the first meta tensor: most models have none
    below: tuple[str, ...] = ()  # the prefixes of their submodules' addresses
    for address, module in named_modules:
        params, buffers = module._parameters, module._buffers
        if not params and not buffers:  # most modules: activations, containers
            continue
        for name, tensor in (*params.items(), *buffers.items()):
            if tensor is not None and tensor.is_meta:
                if offloaded is None:
                    offloaded = _offloaded(named_modules)
                    below = tuple(f"{a}." if a else "" for a in offloaded)
                if address in offloaded or address.startswith(below):
                    continue
                name = f"{address}.{name}" if address else name
                raise ModelInputError(
                    f"model parameter or buffer {name!r} is on the meta device and holds no "
                    "values; materialise the model first (model.to_empty(device='cpu') and load "
                    "weights)")


def _offloaded(named_modules: list) -> tuple[str, ...]:
    """Addresses of the modules carrying an accelerate hook that loads offloaded weights
    (read by duck typing: torchlog does not import accelerate)."""
    found = []
    for address, module in named_modules:
        hook = module.__dict__.get("_hf_hook")
        hooks = getattr(hook, "hooks", (hook,))  # accelerate's SequentialHook holds several
        if any(getattr(h, "offload", False) is True for h in hooks):
            found.append(address)
    return tuple(found)


class _Forward(NamedTuple):
    """A forward's signature as a bound method (self left out), and the fewest and most
    positional arguments it takes when no keyword is required (None: a keyword is), so
    that the usual call skips `Signature.bind` (about 20 us)."""

    signature: inspect.Signature
    fewest: int | None
    most: float | None
    # Whether a list of several positional arguments is one argument: forward takes one
    # required positional argument (at most) and no *args (see positional_args).
    one_sequence: tuple[int, bool]  # (number of positional parameters, whether that holds)


# forward function -> its _Forward; read once per function, not per call:
# inspect.signature costs more than logging a small model.
_forwards: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _forward(model: nn.Module) -> _Forward | None:
    forward = model.forward
    # A bound method is read by its function; a plain function set on the instance (a
    # wrapper such as generation's step logger) by itself.
    func = getattr(forward, "__func__", forward if isinstance(forward, types.FunctionType) else None)
    entry = _forwards.get(func) if func is not None else None
    if entry is None:
        try:
            signature = inspect.signature(forward)
        except (TypeError, ValueError):  # builtins or C extensions: nothing to inspect
            return None
        params = list(signature.parameters.values())
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        required = sum(p.default is p.empty for p in positional)
        spread = any(p.kind == p.VAR_POSITIONAL for p in params)
        one = (len(positional), not spread and len(positional) >= 1 and required <= 1)
        if any(p.kind == p.KEYWORD_ONLY and p.default is p.empty for p in params):
            entry = _Forward(signature, None, None, one)
        else:
            entry = _Forward(signature, required, float("inf") if spread else len(positional), one)
        if func is not None:
            _forwards[func] = entry
    return entry


def positional_args(model: nn.Module, input_args: Any) -> tuple:
    if isinstance(input_args, (list, tuple)):
        entry = _forward(model) if len(input_args) > 1 else None
        if entry is not None:
            num_positional, may_be_one = entry.one_sequence
            if may_be_one and len(input_args) > num_positional:
                return (input_args,)  # forward takes one tuple/list argument: do not spread it
        return tuple(input_args)
    if input_args is None:
        raise ModelInputError(
            "input_args is None; pass a tensor, or a list/tuple of forward's positional arguments")
    return (input_args,)


def _check_binds(model: nn.Module, args: tuple, kwargs: dict) -> None:
    entry = _forward(model)
    if entry is None:
        return
    if not kwargs and entry.fewest is not None and entry.fewest <= len(args) <= entry.most:
        return  # positional parameters fill in order: the required ones come first
    signature = entry.signature
    params = list(signature.parameters.values())
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        names = ", ".join(p.name for p in params) or "no arguments"
        raise ModelInputError(
            f"{type(model).__name__}.forward({names}) cannot take {len(args)} positional "
            f"argument(s) and keywords {sorted(kwargs)!r}: {exc}") from None


def check_render_options(options: dict[str, Any]) -> dict[str, Any] | None:
    """The `render_graph` arguments the `vis_*` keywords ask for, or None to draw nothing.

    Warns (TorchlogWarning) when rendering options come with vis_opt='none'.

    Raises:
        InvalidArgumentTypeError, InvalidOptionError: see torchlog.vis.options_from_keywords.
    """
    if not options:
        return None
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
