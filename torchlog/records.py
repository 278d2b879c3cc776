"""The data records of a logged pass: one per op execution, per layer, per module."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

import torch

__all__ = ["NodeKind", "LazyTensor", "TensorMeta", "ParamInfo", "ParentEdge", "PassRecord",
           "PassSpan", "LayerRecord", "ModuleRecord", "FailedArg", "FailedOp"]


class NodeKind(str, Enum):
    """Where a pass's tensor came from: the closed set of node kinds, each exclusive."""

    INPUT = "input"  # a tensor passed to the model
    OUTPUT = "output"  # a tensor the model returned
    BUFFER = "buffer"  # a module buffer read during forward
    SOURCE = "source"  # a tensor with no recorded producer (from_numpy, attributes)
    CREATED = "created"  # made inside forward with no tensor inputs (zeros, arange)
    OP = "op"  # computed by an op from logged tensors

    def __str__(self) -> str:
        return self.value


class LazyTensor:
    """A saved activation that lives elsewhere (an HDF5 file) and is read on access.

    Storage backends subclass it; `PassRecord.tensor_contents` calls `load()`.
    """

    def load(self) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement load()")


class TensorMeta(NamedTuple):
    """Shape, dtype and size of a tensor, kept even when its values are not saved."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    num_bytes: int

    @classmethod
    def of(cls, tensor: torch.Tensor) -> "TensorMeta":
        """Read the metadata of `tensor` (never its values)."""
        return cls(tuple(tensor.shape), tensor.dtype, tensor.element_size() * tensor.numel())


class ParamInfo(NamedTuple):
    """A parameter an op used: its address in the model, shape and size."""

    address: str
    shape: tuple[int, ...]
    num_params: int
    num_bytes: int


class ParentEdge(NamedTuple):
    """One tensor argument of an op: which pass produced it and where it was passed.

    `arg` is the positional index (int), keyword name (str), or a tuple path into a
    nested list/dict argument (`(0, 1)` = second tensor of the list passed first).
    """

    label: str
    arg: Any


class FailedArg(NamedTuple):
    """One tensor argument of the op that raised: where it was passed and what it was."""

    arg: Any  # as ParentEdge.arg: position, keyword name, or path into a nested argument
    shape: tuple[int, ...] | None  # None for a tensor without a shape (a nested tensor)
    dtype: torch.dtype
    source: str | None  # the pass that made it ('relu_1_2'), a parameter's address, or None


@dataclass(frozen=True, slots=True)
class FailedOp:
    """The torch call that raised in a partial history: what ran, where, on which tensors."""

    func_name: str  # 'cat', as PassRecord.func_name
    call_site: str | None  # 'model.py:23 in forward', as PassRecord.call_site
    source_line: str | None  # the text of that line, stripped; None when the file is unreadable
    args: tuple[FailedArg, ...]  # its tensor arguments in argument order


class _WeaklyReferable:
    """Lets a slotted record be weakly referenced and name its history's key index
    (`_key_index`, see torchlog.lookup.claim)."""

    __slots__ = ("__weakref__", "_key_index")


@dataclass(slots=True, eq=False)
class PassRecord(_WeaklyReferable):
    """One execution of one op (an unrolled node of the graph)."""

    label: str  # 'linear_1_1:2', or 'conv2d_3_7' when the layer ran once
    layer_label: str  # 'linear_1_1'
    layer_type: str  # 'linear'
    func_name: str  # name of the torch function that ran, e.g. 'linear', '__getitem__'
    kind: NodeKind  # input, output, buffer, source, created or op
    op_index: int  # 0-based position in execution order over all passes
    pass_num: int  # 1-based
    num_passes: int  # passes of this layer in the whole forward pass
    tensor_meta: TensorMeta  # of the op's real output (before activation_postfunc)
    saved: Any  # saved copy (a tensor, a LazyTensor, or a postfunc result); None when not saved
    parents: tuple[ParentEdge, ...]  # tensor arguments in argument order
    children: tuple[str, ...]  # passes that took this output as an argument
    params: tuple[ParamInfo, ...]  # parameters the op used
    grad_fn_name: str | None  # e.g. 'ConvolutionBackward0'
    containing_modules: tuple[str, ...]  # 'address:pass', innermost first
    output_of_modules: tuple[str, ...]  # 'address:pass' of module calls that returned this
    output_index: int  # which tensor of a multi-output op's result (0 for single)
    # Wall time of the torch call alone (saving and other capture work are outside it); for
    # an asynchronous CUDA op, its launch unless profile=True (which synchronizes).
    elapsed_s: float
    is_inplace: bool = False  # the op wrote into an existing tensor
    buffer_address: str | None = None  # buffers: 'bn.running_mean'; inputs: where passed, 'args[0]'
    func_args: Any = None  # (args, kwargs) with tensors replaced, when save_function_args
    # RNG state before the op, when save_function_args: the CPU state, or for an op on CUDA
    # (cpu_state, device_index, cuda_state) (capture/rng.py)
    rng_state: torch.Tensor | tuple | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. Triton grid and constexprs
    call_site: str | None = None  # 'file.py:42 in forward': the user code that ran the op
    grad_saved: Any = None  # gradient of the loss w.r.t. this output: a tensor, a LazyTensor, or None
    # With profile=True (else None), per call, on its first output: bytes autograd saved for
    # backward while the op ran (parameters and buffers left out), and on CUDA the allocator's
    # peak during the op over what was allocated when it started.
    saved_for_backward_bytes: int | None = None
    peak_bytes: int | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.tensor_meta.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.tensor_meta.dtype

    @property
    def num_bytes(self) -> int:
        return self.tensor_meta.num_bytes

    @property
    def parent_labels(self) -> tuple[str, ...]:
        """Distinct parent passes in argument order (`x + x` lists `x` once)."""
        return tuple(dict.fromkeys(edge.label for edge in self.parents))

    @property
    def num_params(self) -> int:
        return sum(p.num_params for p in self.params)

    # The kind as TorchLens's flags, read-only.
    @property
    def is_input(self) -> bool:
        return self.kind == NodeKind.INPUT

    @property
    def is_output(self) -> bool:
        return self.kind == NodeKind.OUTPUT

    @property
    def is_buffer(self) -> bool:
        return self.kind == NodeKind.BUFFER

    @property
    def is_source(self) -> bool:
        return self.kind == NodeKind.SOURCE

    @property
    def is_created(self) -> bool:
        return self.kind == NodeKind.CREATED

    @property
    def tensor_contents(self) -> Any:
        """The saved activation (read from disk now if the log is on disk); None if not saved."""
        saved = self.saved
        return saved.load() if isinstance(saved, LazyTensor) else saved

    @property
    def has_saved_tensor(self) -> bool:
        return self.saved is not None

    @property
    def grad_contents(self) -> torch.Tensor | None:
        """The gradient from the latest backward (read from disk now if it streamed to a log
        file); None when no backward reached this pass."""
        grad = self.grad_saved
        return grad.load() if isinstance(grad, LazyTensor) else grad

    @grad_contents.setter
    def grad_contents(self, value: Any) -> None:
        self.grad_saved = value

    @property
    def has_grad(self) -> bool:
        """True when a backward reached this pass (checked without reading the gradient)."""
        return self.grad_saved is not None

    @property
    def module(self) -> str | None:
        """Address of the innermost module the op ran in, without pass; None at top level."""
        return self.containing_modules[0].rpartition(":")[0] if self.containing_modules else None

    def __repr__(self) -> str:
        return f"<PassRecord {self.label} {self.layer_type} {self.tensor_meta.shape}>"

    def __str__(self) -> str:
        from torchlog.display import format_pass  # display imports records, not the reverse

        return format_pass(self)


class PassSpan(NamedTuple):
    """An edge of the rolled graph: which passes of the parent feed which of the child."""

    parent_passes: tuple[int, ...]
    child_passes: tuple[int, ...]


class LayerRecord:
    """A layer with all its passes (a rolled node of the graph).

    `parent_layers` and `child_layers` (layer -> passes linked) are worked out from the
    passes' labels when first read, unless given: most code never reads them.
    """

    __slots__ = ("label", "layer_type", "passes", "_parent_layers", "_child_layers")

    def __init__(self, label: str, layer_type: str, passes: tuple[PassRecord, ...],
                 parent_layers: dict[str, PassSpan] | None = None,
                 child_layers: dict[str, PassSpan] | None = None) -> None:
        self.label = label  # 'linear_1_1'
        self.layer_type = layer_type
        self.passes = passes  # in execution order, pass 1 first
        self._parent_layers = parent_layers
        self._child_layers = child_layers

    @property
    def parent_layers(self) -> dict[str, PassSpan]:
        """Parent layer -> (its passes, this layer's passes) for each link, in pass order."""
        if self._parent_layers is None:
            self._parent_layers = _links(((record.parent_labels, record.pass_num)
                                          for record in self.passes), parents=True)
        return self._parent_layers

    @property
    def child_layers(self) -> dict[str, PassSpan]:
        """Child layer -> (this layer's passes, its passes) for each link, in pass order."""
        if self._child_layers is None:
            self._child_layers = _links(((record.children, record.pass_num)
                                         for record in self.passes), parents=False)
        return self._child_layers

    @property
    def num_passes(self) -> int:
        return len(self.passes)

    @property
    def first(self) -> PassRecord:
        return self.passes[0]

    def __getitem__(self, pass_num: int) -> PassRecord:
        """Return pass `pass_num` (1-based)."""
        if not isinstance(pass_num, int) or not 1 <= pass_num <= len(self.passes):
            from torchlog.errors import LayerNotFoundError

            raise LayerNotFoundError(
                f"layer {self.label!r} has passes 1..{len(self.passes)}; got {pass_num!r}"
            )
        return self.passes[pass_num - 1]

    def __len__(self) -> int:
        return len(self.passes)

    def __iter__(self):
        return iter(self.passes)

    @property
    def tensor_contents(self) -> list[torch.Tensor | None]:
        """Saved activations of every pass, pass 1 first."""
        return [p.tensor_contents for p in self.passes]

    def __repr__(self) -> str:
        return f"<LayerRecord {self.label} x{len(self.passes)}>"

    def __str__(self) -> str:
        from torchlog.display import format_layer

        return format_layer(self)


def _links(linked: Any, parents: bool) -> dict[str, PassSpan]:
    """Layer -> PassSpan from (labels of linked passes, own pass number) per pass."""
    spans: dict[str, tuple[list[int], list[int]]] = {}
    for labels, own in linked:
        for label in labels:
            base, sep, tail = label.rpartition(":")
            layer, other = (base, int(tail)) if sep else (label, 1)
            span = spans.get(layer)
            if span is None:
                span = spans[layer] = ([], [])
            span[0].append(other if parents else own)
            span[1].append(own if parents else other)
    return {layer: PassSpan(tuple(a), tuple(b)) for layer, (a, b) in spans.items()}


@dataclass(slots=True, eq=False)
class ModuleRecord:
    """A submodule of the model and what each of its calls returned."""

    address: str  # 'features.6'
    type_name: str  # 'Conv2d'
    num_params: int  # parameters owned directly or by submodules
    children: tuple[str, ...]  # addresses of direct submodules
    call_outputs: tuple[tuple[str, ...], ...]  # per call: labels of the passes it returned
    call_layers: tuple[tuple[str, ...], ...]  # per call: labels of passes computed inside it
    aliases: tuple[str, ...] = ()  # its other addresses when registered under several ('blocks.1.cpe')

    @property
    def num_passes(self) -> int:
        return len(self.call_outputs)

    def __repr__(self) -> str:
        return f"<ModuleRecord {self.address} ({self.type_name}) x{self.num_passes}>"
