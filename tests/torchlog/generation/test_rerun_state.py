"""Putting a step's arguments back as they were between two runs of the model."""
from __future__ import annotations

import torch

from torchlog.generation.rerun_state import ArgumentState


class Layer:
    def __init__(self) -> None:
        self.keys = None


class Cache:
    def __init__(self) -> None:
        self.layers = [Layer()]
        self.seen = {"tokens": 0}


def test_restore_puts_back_lists_dicts_and_attributes_keeping_tensors_by_reference() -> None:
    cache = Cache()
    prefix = torch.ones(1, 3)
    cache.layers[0].keys = prefix
    state = ArgumentState((torch.zeros(2),), {"cache": cache, "flag": True})
    cache.layers[0].keys = torch.cat([prefix, torch.ones(1, 1)], dim=1)  # a dynamic cache grows
    cache.layers.append(Layer())
    cache.seen["tokens"] = 4
    cache.extra = "new"
    state.restore()
    assert cache.layers[0].keys is prefix and len(cache.layers) == 1
    assert cache.seen == {"tokens": 0} and not hasattr(cache, "extra")
    assert state.written() is None


def test_a_tensor_written_in_place_is_reported() -> None:
    cache = Cache()
    cache.layers[0].keys = torch.zeros(1, 4)
    state = ArgumentState((), {"cache": cache})
    cache.layers[0].keys[:, 0] = 1.0
    assert state.written() is cache.layers[0].keys


def test_modules_and_cycles_are_not_walked() -> None:
    cache = Cache()
    cache.layers.append(cache)  # a cycle
    module = torch.nn.Linear(2, 2)
    state = ArgumentState((module,), {"cache": cache})
    module.weight.data.add_(1.0)  # a module's parameters are not the step's arguments
    assert state.written() is None
    state.restore()
    assert cache.layers[1] is cache
