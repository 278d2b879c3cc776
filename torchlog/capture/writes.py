"""Torch calls that write into their first argument and return None: `t[i] = v`, `t.data = v`."""
from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["DATA_SET", "SETITEM", "returns_nothing_but_writes"]

SETITEM = torch.Tensor.__setitem__
# What a TorchFunctionMode receives for `t.data = v`: the setter of the `data` getset
# descriptor. Each access makes a new method-wrapper, so it is compared with ==, not `is`.
DATA_SET = torch._C.TensorBase.__dict__["data"].__set__


def returns_nothing_but_writes(func: Callable) -> bool:
    """Whether `func` returns None after writing its first argument, which is then its result."""
    return func is SETITEM or func == DATA_SET
