"""What capture keeps per op before labels exist: raw nodes, capture options, failure info."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from torchlog.records import TensorMeta

if TYPE_CHECKING:
    from torchlog.capture.recorder import Recorder


class RawNode:
    """One node while capturing; turned into a PassRecord once the pass is over."""

    __slots__ = (
        "index", "kind", "func_name", "parents", "children", "params", "module_path",
        "output_index", "call_id", "meta", "saved", "grad_fn_name", "elapsed_ns",
        "is_inplace", "output_of", "address", "func_args", "rng_state", "extra", "site",
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
        self.rng_state: torch.Tensor | None = None
        self.extra: dict | None = None
        self.site: tuple | None = None  # (code object, line) of the user code that called the op


@dataclass(slots=True)
class Failure:
    """Where the forward pass raised, for notes and partial histories."""

    func_name: str | None  # the op that raised, or None when user code raised
    module_path: tuple  # module stack at the failure
    parent_nodes: tuple[int, ...]  # logged tensors the failing op received


@dataclass(slots=True)
class CaptureOptions:
    """What to keep per op; set by the public API after validation."""

    save_all: bool = True
    save_indices: frozenset[int] | None = None  # node indexes to save when not save_all
    detach: bool = False
    output_device: torch.device | None = None
    postfunc: Callable[[torch.Tensor], Any] | None = None
    save_function_args: bool = False
    # Called with (node index, saved copy) as each activation is saved; returns what the
    # node keeps instead (a LazyTensor when streaming to disk). Used by torchlog.storage.
    sink: Callable[[int, Any], Any] | None = None
    # Context-manager factories entered around the forward pass with the recorder, for
    # op sources outside torch functions (Triton kernel launches).
    plugins: tuple[Callable[["Recorder"], Any], ...] = ()
    # Called with (node, tensor) for every new node, e.g. to register gradient hooks.
    on_node: Callable[[RawNode, torch.Tensor], None] | None = None
