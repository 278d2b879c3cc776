"""Finding the tensors inside nested arguments and outputs (lists, tuples, dicts, dataclasses, objects)."""
from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

__all__ = ["Attribute", "find_tensors"]

_Tensor = torch.Tensor


class Attribute(str):
    """A path step that is an object's attribute (`.tensor`), not a key or index."""

    __slots__ = ()


def find_tensors(obj: Any, path: Any = (), attributes: bool = False) -> list[tuple[torch.Tensor, Any]]:
    """Return (tensor, path) for every tensor in `obj`, depth first, in order.

    Paths are tuples of indexes/keys; a bare tensor has the path `()`. Mappings
    (including transformers' ModelOutput), sequences and dataclasses are entered.
    With `attributes`, so are the instance attributes of plain objects (a class with
    `self.tensor = t`), each step an `Attribute`; modules, classes and functions are not.
    """
    if type(obj) is _Tensor:  # the usual module output
        return [(obj, path)]
    found: list[tuple[torch.Tensor, Any]] = []
    _walk(obj, path, found, 0, set() if attributes else None)
    return found


def _walk(obj: Any, path: tuple, found: list, depth: int, seen: set | None) -> None:
    if isinstance(obj, _Tensor):
        found.append((obj, path))
    elif depth > 32:
        return  # self-referencing containers: stop rather than recurse forever
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            _walk(item, path + (i,), found, depth + 1, seen)
    elif isinstance(obj, Mapping):
        for key, item in obj.items():
            _walk(item, path + (key,), found, depth + 1, seen)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            _walk(getattr(obj, f.name, None), path + (f.name,), found, depth + 1, seen)
    elif seen is not None and _is_plain_object(obj) and id(obj) not in seen:
        seen.add(id(obj))  # an object reachable twice is entered once
        for name, item in vars(obj).items():
            _walk(item, path + (Attribute(name),), found, depth + 1, seen)


def _is_plain_object(obj: Any) -> bool:
    """An instance of a user class holding data, not a module, class, function or model."""
    return (hasattr(obj, "__dict__") and not isinstance(obj, (type, types.ModuleType, nn.Module))
            and not callable(obj))
