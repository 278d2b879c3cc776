"""Probes kept per model and input signature, so that a site only a finished pass can
resolve costs one probe for a model, not one per call."""
from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any

import torch
from torch import nn

from torchlog.history import ModelHistory

__all__ = ["ProbeCache", "PROBES", "signature"]

_SCALARS = (int, float, bool, str, type(None))
_MAX_DEPTH = 6  # cache -> layers list -> layer -> tensors, with room for wrappers


def signature(model: nn.Module, named_modules: list, args: tuple, kwargs: dict) -> tuple:
    """What decides which ops a model runs, as far as torchlog can see it before the pass:
    the model's identity and train/eval flags, and the inputs' structure, with each tensor's
    shape, dtype and device and each plain scalar's value (a flag such as `use_cache`)."""
    return (id(model), tuple(m.training for _, m in named_modules), _shape_of(args), _shape_of(kwargs))


def _shape_of(value: Any, depth: int = 0) -> Any:
    """The structure of an argument. An object's attributes count too, a few levels deep:
    a KV cache object holds the tensors whose lengths decide the shapes of attention's ops."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device.type, value.requires_grad)
    if isinstance(value, _SCALARS):
        return value
    if depth >= _MAX_DEPTH:
        return type(value).__qualname__
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_shape_of(v, depth + 1) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _shape_of(v, depth + 1)) for k, v in value.items()))
    attributes = getattr(value, "__dict__", None)
    if isinstance(value, (nn.Module, type)) or callable(value) or not isinstance(attributes, dict):
        return type(value).__qualname__
    return (type(value).__qualname__, tuple((k, _shape_of(v, depth + 1)) for k, v in attributes.items()))


class ProbeCache:
    """The last few probes (metadata-only histories), each for one model and signature.

    A probe is reused only for the same live model object (a weak reference, so the cache
    never keeps a model alive); a pass that then runs other ops than the probe is caught
    by the plan's check, and the API drops the probe and probes again.
    """

    # Served passes (torchlog/served.py) that in a row ran other ops than the kept probe,
    # after which a signature is logged in full without trying: a model whose ops change at
    # every call would otherwise run twice per call.
    MAX_MISSES = 2

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._probes: OrderedDict[tuple, tuple[weakref.ref, ModelHistory]] = OrderedDict()
        self._misses: dict[tuple, tuple[weakref.ref, int]] = {}  # key -> (model, misses in a row)

    def get(self, model: nn.Module, key: tuple) -> ModelHistory | None:
        found = self._probes.get(key)
        if found is None or found[0]() is not model:
            return None
        self._probes.move_to_end(key)
        return found[1]

    def put(self, model: nn.Module, key: tuple, probe: ModelHistory) -> None:
        self._probes[key] = (weakref.ref(model), probe)
        self._probes.move_to_end(key)
        while len(self._probes) > self.size:
            self._probes.popitem(last=False)

    def drop(self, key: tuple) -> None:
        self._probes.pop(key, None)

    def servable(self, model: nn.Module, key: tuple) -> bool:
        """Whether a served pass is still worth trying for this model and signature."""
        found = self._misses.get(key)
        return found is None or found[0]() is not model or found[1] < self.MAX_MISSES

    def served(self, model: nn.Module, key: tuple, matched: bool) -> None:
        """Note whether a served pass made the kept probe's calls (a miss counts, a match
        starts the count again)."""
        if matched:
            self._misses.pop(key, None)
            return
        found = self._misses.get(key)
        misses = found[1] if found is not None and found[0]() is model else 0
        self._misses[key] = (weakref.ref(model), misses + 1)
        if len(self._misses) > 4 * self.size:  # forget the oldest (dicts keep insertion order)
            del self._misses[next(iter(self._misses))]

    def drop_model(self, model: nn.Module) -> None:
        """Forget every probe of `model` (after changing it in a way its signature misses)."""
        for key in [k for k, (ref, _) in self._probes.items() if ref() is model or k[0] == id(model)]:
            del self._probes[key]
        for key in [k for k, (ref, _) in self._misses.items() if ref() is model or k[0] == id(model)]:
            del self._misses[key]


PROBES = ProbeCache()
