"""What an intervention does to a value: ablate, scale, clamp, steer, add noise, project, replace, patch, splice.

Each action is a small callable object `action(value, firing) -> Tensor` with a short
`repr` naming it and its parameters, and `params()` giving them as plain data for log
files. Every action takes `index=`, a tensor index (`(slice(None), 3)`: position 3 of
dimension 1): the action then sees `value[index]` only and the rest of the value is kept.
Actions never write into the value they are given: the result is a new tensor, built with
differentiable ops, so gradients flow through it to the value and to tensor parameters
that require grad (a steering vector can be optimised).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from torchlog.capture import Firing
from torchlog.errors import InterventionError, InvalidArgumentTypeError, InvalidOptionError

__all__ = ["Action", "add", "clamp", "mean_ablate", "noise", "patch_from", "project_out",
           "replace_with", "scale", "splice", "zero_ablate", "as_action"]

_INDEX_TYPES = (int, slice, type(Ellipsis), type(None), torch.Tensor, list)


class Action:
    """Base of the actions: `edit` changes the (indexed part of the) value."""

    name = "action"

    def __init__(self, index: Any = None) -> None:
        self.index = _checked_index(index)

    def __call__(self, value: torch.Tensor, firing: Firing) -> torch.Tensor:
        if self.index is None:
            return self.edit(value, firing)
        new = value.clone()
        new[self.index] = self.edit(value[self.index], firing)
        return new

    def edit(self, value: torch.Tensor, firing: Firing) -> torch.Tensor:
        raise NotImplementedError

    def params(self) -> dict[str, Any]:
        """The parameters, as JSON-ready values (a tensor as its shape and dtype)."""
        found = {k: _plain(v) for k, v in self._fields().items()}
        if self.index is not None:
            found["index"] = _index_text(self.index)
        return found

    def _fields(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        params = self.params()
        params.update({k: v for k, v in self._fields().items() if isinstance(v, tuple)})
        shown = [f"{k}={v}" if isinstance(v, str) and k in ("index", "tensor", "vector", "direction", "module")
                 else f"{k}={v!r}" for k, v in params.items()]
        return f"{self.name}({', '.join(shown)})"


class _Zero(Action):
    name = "zero_ablate"

    def edit(self, value: torch.Tensor, firing: Firing) -> torch.Tensor:
        return torch.zeros_like(value)


class _Mean(Action):
    name = "mean_ablate"

    def __init__(self, dims: int | tuple[int, ...], index: Any = None) -> None:
        super().__init__(index)
        if isinstance(dims, int) and not isinstance(dims, bool):
            dims = (dims,)
        if not isinstance(dims, (tuple, list)) or not dims or not all(
                isinstance(d, int) and not isinstance(d, bool) for d in dims):
            raise InvalidArgumentTypeError(
                f"mean_ablate(dims=...) takes an int or a non-empty tuple of ints (the dimensions "
                f"to average over, e.g. 0 for the batch), got {dims!r}")
        self.dims = tuple(dims)

    def edit(self, value: torch.Tensor, firing: Firing) -> torch.Tensor:
        return value.mean(dim=self.dims, keepdim=True).expand_as(value).contiguous()

    def _fields(self) -> dict[str, Any]:
        return {"dims": self.dims}


class _Scale(Action):
    name = "scale"

    def __init__(self, k: float, index: Any = None) -> None:
        super().__init__(index)
        self.k = _number(k, "scale(k)")

    def edit(self, value: torch.Tensor, firing: Firing) -> torch.Tensor:
        return value * self.k

    def _fields(self) -> dict[str, Any]:
        return {"k": self.k}


class _Clamp(Action):
    name = "clamp"

    def __init__(self, min: float | None = None, max: float | None = None, index: Any = None) -> None:
        super().__init__(index)
        if min is None and max is None:
            raise InvalidOptionError("clamp() needs min, max or both; clamp(None, None) would change nothing")
        self.min = None if min is None else _number(min, "clamp(min)")
        self.max = None if max is None else _number(max, "clamp(max)")

    def edit(self, value: torch.Tensor, firing: Firing) -> torch.Tensor:
        return value.clamp(self.min, self.max)

    def _fields(self) -> dict[str, Any]:
        return {"min": self.min, "max": self.max}


class _Add(Action):
    name = "add"

    def __init__(self, vector: torch.Tensor, alpha: float = 1.0, dim: int = -1, index: Any = None) -> None:
        super().__init__(index)
        self.vector = _tensor(vector, "add(vector)")
        self.alpha = _number(alpha, "add(alpha)")
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise InvalidArgumentTypeError(f"add(dim=...) takes an int, got {dim!r}")
        self.dim = dim

    def edit(self, value: torch.Tensor, firing: Firing) -> torch.Tensor:
        vector = _along(self.vector, value, self.dim, "add")
        _same_kind(vector, value, "add's vector")
        return value + self.alpha * vector

    def _fields(self) -> dict[str, Any]:
        return {"vector": self.vector, "alpha": self.alpha, "dim": self.dim}


class _Noise(Action):
    name = "noise"

    def __init__(self, std: float, seed: int = 0, index: Any = None) -> None:
        super().__init__(index)
        self.std = _number(std, "noise(std)")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise InvalidArgumentTypeError(f"noise(seed=...) takes an int >= 0, got {seed!r}")
        self.seed = seed

    def edit(self, value: torch.Tensor, firing: Firing) -> torch.Tensor:
        # Its own generator, seeded per pass: the model's and torch's RNGs are not touched,
        # and the same seed gives the same noise at the same op on every run.
        generator = torch.Generator(device=value.device).manual_seed(self.seed * 1_000_003 + firing.op_index)
        draw = torch.randn(value.shape, generator=generator, device=value.device, dtype=value.dtype)
        return value + self.std * draw

    def _fields(self) -> dict[str, Any]:
        return {"std": self.std, "seed": self.seed}


class _ProjectOut(Action):
    name = "project_out"

    def __init__(self, direction: torch.Tensor, dim: int = -1, index: Any = None) -> None:
        super().__init__(index)
        self.direction = _tensor(direction, "project_out(direction)")
        if self.direction.dim() != 1 or not self.direction.is_floating_point():
            raise InvalidOptionError(
                f"project_out(direction) takes a 1-D floating-point tensor, got shape "
                f"{tuple(self.direction.shape)} of {self.direction.dtype}")
        self.dim = dim

    def edit(self, value: torch.Tensor, firing: Firing) -> torch.Tensor:
        unit = self.direction / self.direction.norm()
        unit = _along(unit, value, self.dim, "project_out")
        _same_kind(unit, value, "project_out's direction")
        return value - (value * unit).sum(dim=self.dim, keepdim=True) * unit

    def _fields(self) -> dict[str, Any]:
        return {"direction": self.direction, "dim": self.dim}


class _Replace(Action):
    name = "replace_with"

    def __init__(self, tensor: torch.Tensor, index: Any = None) -> None:
        super().__init__(index)
        self.tensor = _tensor(tensor, "replace_with(tensor)")

    def edit(self, value: torch.Tensor, firing: Firing) -> torch.Tensor:
        _same_kind(self.tensor, value, "the replacement")
        try:
            shaped = torch.broadcast_to(self.tensor, value.shape)
        except RuntimeError:
            raise InterventionError(
                f"the replacement of shape {tuple(self.tensor.shape)} does not broadcast to the "
                f"value's shape {tuple(value.shape)}") from None
        return shaped.clone()  # a new tensor: the model may write into what it gets

    def _fields(self) -> dict[str, Any]:
        return {"tensor": self.tensor}


class _PatchFrom(Action):
    name = "patch_from"

    def __init__(self, history: Any, index: Any = None) -> None:
        super().__init__(index)
        from torchlog.history import ModelHistory

        if not isinstance(history, ModelHistory):
            raise InvalidArgumentTypeError(
                f"patch_from takes a ModelHistory (the run to copy values from), got {history!r}")
        if history.info.activation_postfunc is not None:
            raise InvalidOptionError(
                f"patch_from: {history!r} was logged with activation_postfunc="
                f"{history.info.activation_postfunc}, so its saved values are that function's results, "
                "not the activations to patch in; log the source run without activation_postfunc")
        self.history = history

    def __call__(self, value: torch.Tensor, firing: Firing) -> torch.Tensor:
        source = self._source(firing).to(value.device)
        if self.index is not None:
            source = source[self.index]
            new = value.clone()
            new[self.index] = source
            return new
        return source.clone()

    def _module_output(self, firing: Firing) -> str:
        """The label of the same tensor of the same module call in the other run (the
        output a module site acts on: its first, or `output=k`)."""
        (address, call), index = firing.module_call, (firing.module_output or (0, 1))[0]
        module = self.history.modules.get(address)
        calls = module.call_outputs if module is not None else ()
        if call > len(calls) or index >= len(calls[call - 1]):
            raise InterventionError(
                f"patch_from: the other run has no output {index} of {address}:{call} (its model "
                f"called {address!r} {len(calls)} time(s)); log both runs with the same ops")
        return calls[call - 1][index]

    def _source(self, firing: Firing) -> torch.Tensor:
        """The same site's saved value in the other run, on this value's device."""
        from torchlog.history import all_passes

        other = self.history
        if firing.label is not None:
            key = firing.label
        elif firing.module_call is not None and firing.module_input is None:
            key = self._module_output(firing)
        else:  # an op site, or a module input: the value of the pass that made it
            passes = all_passes(other)
            if not 0 <= firing.op_index < len(passes) or passes[firing.op_index].func_name != firing.func_name:
                raise InterventionError(
                    f"patch_from: the other run has no op {firing.func_name!r} at position "
                    f"{firing.op_index}, so there is no same site to copy from; name the site by "
                    "label or module address, or log both runs with the same ops (torchlog.run numbers "
                    "no passes: patch a module input through log_forward_pass)")
            key = passes[firing.op_index].label
        if key not in other:
            raise InterventionError(
                f"patch_from: the other run has no pass {key!r} (its model ran other ops or "
                f"layers_to_save left it out); log it with layers_to_save='all' or including {key!r}")
        record = other[key]
        record = getattr(record, "passes", (record,))[0] if not hasattr(record, "tensor_contents") else record
        saved = record.tensor_contents
        if saved is None:
            raise InterventionError(
                f"patch_from: pass {record.label!r} of the other run kept no value; log that run "
                "with layers_to_save='all' or including this site")
        return torch.as_tensor(saved)

    def params(self) -> dict[str, Any]:
        found = {"history": f"<{self.history.model_name} run, seed {self.history.random_seed}>"}
        if self.index is not None:
            found["index"] = _index_text(self.index)
        return found


class _Splice(Action):
    name = "splice"

    def __init__(self, module: Callable[[torch.Tensor], torch.Tensor], index: Any = None) -> None:
        super().__init__(index)
        if not callable(module):
            raise InvalidArgumentTypeError(
                f"splice takes a module or callable (tensor -> tensor of the same shape), got {module!r}")
        self.module = module

    def edit(self, value: torch.Tensor, firing: Firing) -> torch.Tensor:
        return self.module(value)

    def _fields(self) -> dict[str, Any]:
        return {"module": type(self.module).__name__ if isinstance(self.module, nn.Module)
                else getattr(self.module, "__name__", type(self.module).__name__)}


class _Call(Action):
    """A user's callable `fn(value, firing) -> Tensor`."""

    name = "call"

    def __init__(self, fn: Callable[[torch.Tensor, Firing], torch.Tensor]) -> None:
        super().__init__(None)
        self.fn = fn

    def __call__(self, value: torch.Tensor, firing: Firing) -> torch.Tensor:
        new = self.fn(value, firing)
        if new is None:
            raise InterventionError(
                f"{self!r} returned None; an intervention callable must return the new value "
                "(return `value` itself to leave it unchanged)")
        return new

    def params(self) -> dict[str, Any]:
        return {"fn": getattr(self.fn, "__qualname__", type(self.fn).__name__)}

    def __repr__(self) -> str:
        return f"call({self.params()['fn']})"


def zero_ablate(index: Any = None) -> Action:
    """Replace the value (or `value[index]`) with zeros."""
    return _Zero(index)


def mean_ablate(dims: int | tuple[int, ...], index: Any = None) -> Action:
    """Replace the value with its mean over `dims` (e.g. 0: the batch mean), broadcast back."""
    return _Mean(dims, index)


def scale(k: float, index: Any = None) -> Action:
    """Multiply the value by `k`."""
    return _Scale(k, index)


def clamp(min: float | None = None, max: float | None = None, index: Any = None) -> Action:  # noqa: A002
    """Clamp the value into [min, max]."""
    return _Clamp(min, max, index)


def add(vector: torch.Tensor, alpha: float = 1.0, dim: int = -1, index: Any = None) -> Action:
    """Add `alpha * vector` (steering); a 1-D vector lies along dimension `dim` (the last by
    default) and broadcasts over the others. Gradients reach a vector that requires grad."""
    return _Add(vector, alpha, dim, index)


def noise(std: float, seed: int = 0, index: Any = None) -> Action:
    """Add Gaussian noise of standard deviation `std`, drawn from its own generator (`seed`)."""
    return _Noise(std, seed, index)


def project_out(direction: torch.Tensor, dim: int = -1, index: Any = None) -> Action:
    """Remove the component along `direction` (a 1-D tensor along dimension `dim`)."""
    return _ProjectOut(direction, dim, index)


def replace_with(tensor: torch.Tensor, index: Any = None) -> Action:
    """Replace the value with `tensor` (same dtype and device, broadcast to the value's shape)."""
    return _Replace(tensor, index)


def patch_from(history: Any, index: Any = None) -> Action:
    """Replace the value with the same site's saved value in `history` (activation patching):
    the same pass label, module call, or op position."""
    return _PatchFrom(history, index)


def splice(module: Callable[[torch.Tensor], torch.Tensor], index: Any = None) -> Action:
    """Replace the value with `module(value)` (e.g. a sparse autoencoder's encode-decode)."""
    return _Splice(module, index)


def as_action(value: Any, site: Any) -> Action:
    """The Action a user's `intervene` value stands for: an Action, a tensor (replace with
    it) or a callable `fn(value, firing) -> Tensor`.

    Raises:
        InvalidArgumentTypeError: anything else, naming the site.
    """
    if isinstance(value, Action):
        return value
    if isinstance(value, torch.Tensor):
        return _Replace(value)
    if callable(value):
        return _Call(value)
    raise InvalidArgumentTypeError(
        f"the action for site {site!r} is {value!r} of type {type(value).__name__}; an action is "
        "a tensor (the replacement), a callable fn(value, firing) -> Tensor, or a helper from "
        "torchlog.interventions (zero_ablate(), scale(k), add(vector), patch_from(history), ...)")


def _checked_index(index: Any) -> Any:
    if index is None:
        return None
    parts = index if isinstance(index, tuple) else (index,)
    for part in parts:
        if isinstance(part, bool) or not isinstance(part, _INDEX_TYPES):
            raise InvalidArgumentTypeError(
                f"index={index!r} is not a tensor index; use ints, slices, Ellipsis, None or index "
                "tensors, e.g. index=(slice(None), 3) for position 3 of dimension 1")
    return index


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentTypeError(f"{what} takes a number, got {value!r}")
    return value


def _tensor(value: Any, what: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise InvalidArgumentTypeError(f"{what} takes a torch.Tensor, got {value!r} of type {type(value).__name__}")
    return value


def _along(vector: torch.Tensor, value: torch.Tensor, dim: int, what: str) -> torch.Tensor:
    """A 1-D `vector` shaped to broadcast along `value`'s dimension `dim`; others as they are."""
    if vector.dim() != 1:
        return vector
    axis = dim % value.dim() if value.dim() else 0
    if value.dim() == 0 or value.shape[axis] != vector.shape[0]:
        raise InterventionError(
            f"{what}: a vector of length {vector.shape[0]} does not lie along dimension {dim} of a "
            f"value of shape {tuple(value.shape)}; give dim= the dimension of size {vector.shape[0]}")
    shape = [1] * value.dim()
    shape[axis] = vector.shape[0]
    return vector.reshape(shape)


def _same_kind(tensor: torch.Tensor, value: torch.Tensor, what: str) -> None:
    if tensor.dtype != value.dtype or tensor.device != value.device:
        raise InterventionError(
            f"{what} is {tensor.dtype} on {tensor.device}, the value {value.dtype} on "
            f"{value.device}; give it the value's dtype and device (.to(dtype=..., device=...))")


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return f"<tensor {tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}>"
    if isinstance(value, tuple):
        return list(value)
    return value


def _index_text(index: Any) -> str:
    parts = index if isinstance(index, tuple) else (index,)

    def one(part: Any) -> str:
        if isinstance(part, slice):
            text = ":".join("" if v is None else str(v) for v in (part.start, part.stop, part.step))
            return text.rstrip(":") or ":"
        if part is Ellipsis:
            return "..."
        if isinstance(part, torch.Tensor):
            return f"<tensor {tuple(part.shape)}>"
        return repr(part)

    return "[" + ", ".join(one(p) for p in parts) + "]"
