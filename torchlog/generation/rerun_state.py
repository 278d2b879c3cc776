"""The state a step's arguments hold (a KV cache), put back before the step's model runs again."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["ArgumentState"]

_MAX_DEPTH = 8  # a cache is a few levels deep (cache -> layers list -> layer -> tensors)
_LEAVES = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)


class ArgumentState:
    """The containers and objects reachable from a step's arguments, as they were.

    A logged step may run the model more than once (a probe to place its sites, a rerun
    after a saved value was written into); each run appends to the KV cache it is given,
    and the next run's capture reads its inputs before forward starts. So after each run
    `restore` puts every list, dict and object attribute back as it was, and once the step
    is logged the state its last run left is put back in turn. Tensors are kept by
    reference, not copied: a cache that concatenates makes new tensors, and one written in
    place (a static cache) is detected by its version counters (`written`).
    """

    def __init__(self, args: tuple, kwargs: dict[str, Any]) -> None:
        self._containers: list[tuple[Any, Any]] = []  # (object, its contents as they were)
        self._tensors: list[tuple[torch.Tensor, int]] = []  # (tensor, version when taken)
        seen: set[int] = set()
        for value in (*args, *kwargs.values()):
            self._take(value, seen, 0)

    def _take(self, value: Any, seen: set[int], depth: int) -> None:
        if isinstance(value, torch.Tensor):
            self._tensors.append((value, value._version))
            return
        if isinstance(value, (_LEAVES, nn.Module)) or depth > _MAX_DEPTH or id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, list):
            self._containers.append((value, list(value)))
            members = list(value)
        elif isinstance(value, dict):
            self._containers.append((value, dict(value)))
            members = list(value.values())
        elif isinstance(value, tuple):
            members = list(value)
        elif hasattr(value, "__dict__") and not callable(value):
            self._containers.append((value, dict(vars(value))))
            members = list(vars(value).values())
        else:
            return
        for member in members:
            self._take(member, seen, depth + 1)

    def written(self) -> torch.Tensor | None:
        """The first tensor of the arguments written in place since they were taken (a
        static KV cache), which restoring cannot undo; None when there is none."""
        return next((tensor for tensor, version in self._tensors if tensor._version != version), None)

    def restore(self) -> None:
        """Put back every list, dict and object attribute that changed since it was taken
        (through the base types' methods: a dict subclass may refuse `update`, as
        transformers' `ModelOutput` does; one that did not change is not touched)."""
        for container, contents in self._containers:
            if isinstance(container, list):
                if not _same(list(container), contents):
                    list.__setitem__(container, slice(None), contents)
                continue
            target = container if isinstance(container, dict) else vars(container)
            if list(dict.keys(target)) != list(contents) or not _same(list(dict.values(target)),
                                                                      list(contents.values())):
                dict.clear(target)
                dict.update(target, contents)


def _same(now: list, then: list) -> bool:
    """Whether two lists hold the same objects (by identity: tensors have no plain ==)."""
    return len(now) == len(then) and all(a is b for a, b in zip(now, then))
