"""Finding the tensors inside nested arguments and outputs (lists, tuples, dicts, dataclasses)."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["find_tensors"]

_Tensor = torch.Tensor


def find_tensors(obj: Any, path: Any = ()) -> list[tuple[torch.Tensor, Any]]:
    """Return (tensor, path) for every tensor in `obj`, depth first, in order.

    Paths are tuples of indexes/keys; a bare tensor has the path `()`. Mappings
    (including transformers' ModelOutput), sequences and dataclasses are entered.
    """
    found: list[tuple[torch.Tensor, Any]] = []
    _walk(obj, path, found, 0)
    return found


def _walk(obj: Any, path: tuple, found: list, depth: int) -> None:
    if isinstance(obj, _Tensor):
        found.append((obj, path))
    elif depth > 32:
        return  # self-referencing containers: stop rather than recurse forever
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            _walk(item, path + (i,), found, depth + 1)
    elif isinstance(obj, Mapping):
        for key, item in obj.items():
            _walk(item, path + (key,), found, depth + 1)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            _walk(getattr(obj, f.name, None), path + (f.name,), found, depth + 1)
