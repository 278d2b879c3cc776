"""LogOptions: what log_forward_pass keeps of a forward pass, checked when the object is made."""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError
from torchlog.gradients import check_gradient_options
from torchlog.sites.entries import check_entries, check_intervene, check_stop_after

__all__ = ["LogOptions", "ON_ERROR", "merge_options", "device_of"]

ON_ERROR = ("raise", "return")
_BOOL_FIELDS = ("keep_unsaved_layers", "detach_saved_tensors", "save_function_args",
                "save_gradients", "overwrite", "profile")
_SEED_RANGE = "None or an int in [0, 2**63)"
_DEVICES = "'same' or an available torch device such as 'cpu' or 'cuda:0'"


@dataclass(frozen=True, slots=True)
class LogOptions:
    """How to log a forward pass; invalid values raise when the object is made.

    Every field is also a keyword of `log_forward_pass`, under the same (TorchLens) name;
    keywords override the fields of an `options` object given with them.

    `random_seed` seeds every global RNG for the pass (torch's, Python's and numpy's); the
    RNG states are restored afterwards. Without it a seed is drawn for torch and Python's
    `random` (history.info.random_seed), and numpy's global RNG is left alone: give a seed
    to reproduce numpy draws made in forward. With `on_error='raise'` the model's exception is re-raised with the partial
    history attached as `exc.torchlog_history`; 'return' returns the partial history.
    `save_gradients` hooks every tensor that requires grad, so that a later `backward()`
    from a saved tensor (or `history.log_backward(loss)`) fills each pass's
    `grad_contents`; it needs detach_saved_tensors=False, and log_forward_pass warns when no
    logged tensor requires grad (torch.no_grad(), frozen model and inputs).
    `save_to` (needs h5py: `pip install torchlog[storage]`) streams the saved activations
    into the file as they are produced and the history reads them back on access, so
    memory stays bounded (docs/storage.md). With both, each gradient is written into the
    file as it arrives (a later backward replaces it) and `tensor_contents` comes from the
    file, cut from the graph: compute the loss from the model's own output (a forward hook
    keeps it).

    Raises:
        InvalidArgumentTypeError: a value has the wrong type (a flag that is not a bool,
            a seed that is not an int, a postfunc that is not callable).
        InvalidOptionError: a value outside the accepted set (negative seed, unknown
            on_error, a device this machine does not have, an empty layers_to_save).

    Example:
        >>> LogOptions(layers_to_save=["linear"], random_seed=0).keep_unsaved_layers
        False
        >>> LogOptions(on_error="ignore")
        Traceback (most recent call last):
        ...
        torchlog.errors.InvalidOptionError: on_error must be one of ('raise', 'return'), got 'ignore'
    """

    # 'all', None (metadata only), or a list of labels, module addresses, int positions
    # and label substrings (see torchlog.selection).
    layers_to_save: str | int | Sequence[str | int] | None = "all"
    keep_unsaved_layers: bool = False  # with a list, also keep the unsaved layers (no tensors)
    output_device: str | int | torch.device = "same"  # 'same', or where saved copies go ('cpu')
    detach_saved_tensors: bool = False  # save copies cut from the autograd graph
    random_seed: int | None = None  # seeds every global RNG during the pass; random when None
    activation_postfunc: Callable[[torch.Tensor], Any] | None = None  # applied before saving
    save_function_args: bool = False  # keep each op's function and arguments (for replay)
    on_error: str = "raise"  # 'raise' the model's error (history attached), or 'return' it
    save_gradients: bool = False  # hook tensors so that a later backward fills grad_contents
    save_to: str | os.PathLike | None = None  # HDF5 file to stream saved activations into
    overwrite: bool = False  # with save_to, replace an existing file instead of refusing
    profile: bool = False  # also count each op's bytes saved for backward and CUDA peak
    # {site: action} or [(site, action), ...]: change activations as the pass runs
    # (torchlog.interventions); the history is the intervened run.
    intervene: Mapping[Any, Any] | Sequence[tuple[Any, Any]] | None = None
    # A site (as intervene takes them): end the pass right after its last pass (or the
    # pass it names) was recorded, and return the history so far (`history.stopped_at`).
    # One module call ('h.1:1', 'cell:3') stops with no other pass; a label, position or
    # module address without call number is found in one logged pass first, which runs
    # the whole model.
    stop_after: Any = None

    def __post_init__(self) -> None:
        for name in _BOOL_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise InvalidArgumentTypeError(f"{name} must be True or False, got {value!r}")
        _check_seed(self.random_seed)
        if self.activation_postfunc is not None and not callable(self.activation_postfunc):
            raise InvalidArgumentTypeError(
                "activation_postfunc must be callable (tensor -> tensor) or None, got "
                f"{self.activation_postfunc!r}")
        if not isinstance(self.on_error, str) or self.on_error not in ON_ERROR:
            raise InvalidOptionError(f"on_error must be one of {ON_ERROR}, got {self.on_error!r}")
        check_gradient_options(self.save_gradients, self.detach_saved_tensors)
        device_of(self.output_device)
        check_entries(self.layers_to_save)
        check_intervene(self.intervene)
        check_stop_after(self.stop_after)

    @property
    def device(self) -> torch.device | None:
        """The device saved copies are moved to; None keeps each where it was computed."""
        return device_of(self.output_device)

    @property
    def entries(self) -> list[int | str] | None:
        """layers_to_save as a fresh list of entries: None saves all, [] saves none."""
        return check_entries(self.layers_to_save)


def merge_options(options: LogOptions | None, keywords: dict[str, Any]) -> tuple[LogOptions, dict[str, Any]]:
    """`options` with the LogOptions keywords applied, and the other (rendering) keywords.

    With LogOptions keywords a new object is made; without, `options` (or shared defaults:
    LogOptions are frozen) is returned as it is.

    Raises:
        InvalidArgumentTypeError: `options` is not a LogOptions, or a keyword is neither a
            LogOptions field nor a rendering option (`vis_*`).
        InvalidOptionError: see LogOptions.
    """
    if options is not None and not isinstance(options, LogOptions):
        raise InvalidArgumentTypeError(
            f"options must be a torchlog.LogOptions or None, got {options!r} of type "
            f"{type(options).__name__}")
    if not keywords:  # the usual call: LogOptions are frozen, so the defaults can be shared
        return (options if options is not None else _DEFAULTS), {}
    names = _FIELD_NAMES
    unknown = [k for k in keywords if k not in names and not k.startswith("vis_")]
    if unknown:
        raise InvalidArgumentTypeError(
            f"log_forward_pass() got unexpected keyword argument(s) {unknown!r}; logging options "
            f"are {', '.join(f.name for f in fields(LogOptions))}, and rendering options start with 'vis_' (vis_opt, "
            "vis_nesting_depth, vis_outpath, vis_fileformat)")
    changes = {k: v for k, v in keywords.items() if k in names}
    merged = replace(options, **changes) if options is not None else LogOptions(**changes)
    return merged, {k: v for k, v in keywords.items() if k not in names}


def _check_seed(seed: Any) -> None:
    if seed is None:
        return
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InvalidArgumentTypeError(
            f"random_seed must be {_SEED_RANGE}, got {seed!r} of type {type(seed).__name__}")
    if not 0 <= seed < 2**63:
        raise InvalidOptionError(f"random_seed must be {_SEED_RANGE}, got {seed!r}")


def device_of(value: Any) -> torch.device | None:
    """The torch device `output_device` names, None for 'same'.

    Raises:
        InvalidArgumentTypeError: not a str, int or torch.device.
        InvalidOptionError: a device this machine cannot allocate on, or 'meta'.
    """
    if isinstance(value, str) and value == "same":
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, torch.device)):
        raise InvalidArgumentTypeError(
            f"output_device must be {_DEVICES}, got {value!r} of type {type(value).__name__}")
    try:
        device = torch.device(value)
        if device.type != "cpu":  # fail now, not halfway through the forward pass
            with torch._C.DisableTorchFunction():
                torch.empty(0, device=device)
    except (RuntimeError, TypeError, AssertionError) as exc:  # torch's "not compiled with CUDA" is an AssertionError
        raise InvalidOptionError(f"output_device must be {_DEVICES}, got {value!r}: {exc}") from exc
    if device.type == "meta":
        raise InvalidOptionError(
            f"output_device must be {_DEVICES}, got {value!r}: meta tensors hold no values")
    return device


_FIELD_NAMES = frozenset(f.name for f in fields(LogOptions))
_DEFAULTS = LogOptions()
