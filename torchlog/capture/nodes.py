"""What capture keeps per op before labels exist: the raw node."""
from __future__ import annotations

from typing import Any

import torch

from torchlog.records import TensorMeta

__all__ = ["OP_CONTEXT_KEY", "RawNode"]

# RawNode.extra key of the state an op ran in when it differed from the usual one (grad mode
# off, inference mode, autocast); kept with save_function_args so replay can restore it.
OP_CONTEXT_KEY = "op_context"


class RawNode:
    """One node while capturing; turned into a PassRecord once the pass is over.

    Plain data: capture fills it in while the op runs, and after the pass only
    assembly (and storage's crash log) reads it.
    """

    __slots__ = (
        "index", "kind", "func_name", "parents", "children", "params", "module_path",
        "output_index", "call_id", "meta", "saved", "grad_fn_name", "elapsed_ns",
        "is_inplace", "output_of", "address", "func_args", "rng_state", "extra", "site",
        "saved_for_backward_bytes", "peak_bytes",
    )

    def __init__(self, index: int, kind: str, func_name: str, parents: list, params: tuple,
                 module_path: tuple, output_index: int, call_id: int, meta: TensorMeta) -> None:
        self.index = index
        self.kind = kind  # 'op', 'input', 'buffer', 'source' or 'output'
        self.func_name = func_name
        self.parents = parents  # [(node index, arg path)] in argument order
        self.children: list[int] = []
        self.params = params  # tuple of ParamInfo
        self.module_path = module_path  # ((address, call number), ...) outermost first
        self.output_index = output_index
        self.call_id = call_id  # nodes from one call of a multi-output op share it
        self.meta = meta
        self.saved: torch.Tensor | None = None
        self.grad_fn_name: str | None = None
        self.elapsed_ns = 0
        self.is_inplace = False
        self.output_of: list[tuple[str, int]] = []  # module calls that returned this tensor
        self.address: str | None = None  # buffer or input name
        self.func_args: Any = None
        self.rng_state: torch.Tensor | tuple | None = None  # capture/rng.py
        self.extra: dict | None = None
        # (call site of the op, call sites of its enclosing modules); each (CodeInfo, offset)
        self.site: tuple | None = None
        # With profile=True, on a call's first output (see capture/profile.py); else None.
        self.saved_for_backward_bytes: int | None = None
        self.peak_bytes: int | None = None
