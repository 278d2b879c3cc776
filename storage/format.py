"""The HDF5 layout of a torchlog file: names, version, and how each torch dtype is stored.

Every torch dtype is written either as the numpy dtype of the same name (float32, int8,
bool, complex64, ...) or, when numpy has no such type (bfloat16, float8_*, complex32,
...), as the unsigned integer of the same width holding the raw bits. The dataset's
`torch_dtype` attribute names the torch dtype, so reading views the bits back exactly.
See docs/storage.md for the whole layout.
"""
from __future__ import annotations

import numpy as np
import torch

from torchlog.errors import InvalidArgumentTypeError

__all__ = ["FORMAT_NAME", "EXTRACT_FORMAT_NAME", "STATISTICS_FORMAT_NAME", "GENERATION_FORMAT_NAME", "FORMAT_VERSION", "WRITING",
           "INCOMPLETE",
           "COMPLETE", "ACTIVATIONS", "GRADIENTS", "RNG_STATES", "BY_LABEL", "METADATA",
           "NODE_LOG", "MODULE_TABLE", "CHUNK_BYTES", "check_dense", "dtype_name", "dtype_from_name",
           "is_bits_encoded", "tensor_to_array", "array_to_tensor", "contiguous", "chunk_shape"]

FORMAT_NAME = "torchlog"  # root attribute `format` of a log written by log_forward_pass/save
EXTRACT_FORMAT_NAME = "torchlog-extract"  # root attribute `format` of an extract() file
STATISTICS_FORMAT_NAME = "torchlog-statistics"  # root attribute `format` of a Statistics.save() file
GENERATION_FORMAT_NAME = "torchlog-generation"  # root attribute `format` of log_generation(save_to=...)
FORMAT_VERSION = 1  # root attribute `format_version`; readers refuse newer versions

# Root attribute `status`.
WRITING = "writing"  # being written, or the writer died: rebuild what is there
INCOMPLETE = "incomplete"  # the forward pass raised; the metadata describes what ran
COMPLETE = "complete"

ACTIVATIONS = "activations"  # group: one dataset (or group, for containers) per saved value
GRADIENTS = "gradients"  # group: grad_contents per op index
RNG_STATES = "rng_states"  # group: rng_state per op index, when save_function_args
BY_LABEL = "by_label"  # group: hard links label -> activation, added when the log is finished
METADATA = "metadata"  # scalar JSON string describing the history (see metadata.py)
NODE_LOG = "node_log"  # group: raw nodes too long for an activation's `nodes` attribute (recovery.py)
MODULE_TABLE = "module_table"  # scalar JSON string: the model's modules, written when streaming starts

CHUNK_BYTES = 4 << 20  # target chunk size: big enough for fast writes, small for slicing

# Dtypes numpy has too: stored as themselves. Every other one is stored as its bits.
_NUMPY_NATIVE = frozenset({
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
    torch.uint32, torch.uint64, torch.float16, torch.float32, torch.float64, torch.complex64,
    torch.complex128,
})
_BITS = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.uint64}
_QUANTIZED = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}
# Every dtype torch defines, by the name `str(dtype)` gives without 'torch.'.
_DTYPES = {str(v).removeprefix("torch."): v for v in vars(torch).values() if isinstance(v, torch.dtype)}


def dtype_name(dtype: torch.dtype) -> str:
    """'float32' for torch.float32: the name stored in files."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """The torch dtype a stored name denotes.

    Raises:
        ValueError: `name` is not the name of a torch dtype.
    """
    found = _DTYPES.get(name)
    if found is None:
        raise ValueError(f"{name!r} is not a torch dtype name (such as 'float32' or 'bfloat16')")
    return found


def is_bits_encoded(dtype: torch.dtype) -> bool:
    """True when numpy has no such dtype, so the raw bits are stored as unsigned ints."""
    return dtype not in _NUMPY_NATIVE


def tensor_to_array(tensor: torch.Tensor, what: str) -> np.ndarray:
    """A numpy array holding `tensor` exactly (on the CPU, contiguous, bits for bfloat16...).

    Raises:
        InvalidArgumentTypeError: a sparse, quantized, nested or meta tensor, which has no
            exact dense form; `what` names the value in the message.
    """
    check_dense(tensor, what)
    plain = tensor.detach().resolve_conj().resolve_neg()
    if plain.device.type != "cpu":
        plain = plain.cpu()
    plain = plain.contiguous()
    if is_bits_encoded(plain.dtype):
        plain = plain.view(_BITS[plain.element_size()])
    return plain.numpy()


def check_dense(tensor: torch.Tensor, what: str) -> None:
    """Check that `tensor` has an exact dense form `tensor_to_array` can write.

    Raises:
        InvalidArgumentTypeError: a sparse, quantized, nested or meta tensor; `what`
            names the value in the message.
    """
    if tensor.layout != torch.strided or tensor.is_nested or tensor.is_meta:
        raise InvalidArgumentTypeError(
            f"{what} is a {tensor.layout} tensor{' (meta)' if tensor.is_meta else ''}, which "
            "cannot be written to HDF5; use activation_postfunc=lambda t: t.to_dense() "
            "or save it in memory instead")
    if tensor.dtype in _QUANTIZED:
        raise InvalidArgumentTypeError(
            f"{what} is a quantized tensor ({tensor.dtype}), which cannot be written to HDF5 "
            "exactly; use activation_postfunc=torch.dequantize or int_repr()")


def array_to_tensor(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """Turn an array read from a file back into the tensor `tensor_to_array` was given.

    Raises:
        ValueError: the array's dtype is not the one `dtype` is stored as.
    """
    tensor = torch.from_numpy(contiguous(array))
    stored_as = _BITS.get(torch.empty((), dtype=dtype).element_size()) if is_bits_encoded(dtype) else dtype
    if tensor.dtype != stored_as:
        raise ValueError(f"a {dtype} tensor is stored as {stored_as}, but the data is {array.dtype}")
    return tensor.view(dtype) if stored_as != dtype else tensor


def contiguous(array: np.ndarray) -> np.ndarray:
    """`array` in C order; unlike np.ascontiguousarray, a 0-d array stays 0-d."""
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def chunk_shape(shape: tuple[int, ...], item_bytes: int) -> tuple[int, ...] | None:
    """Chunks of about CHUNK_BYTES, split along the first axes; None when not chunkable.

    0-d and empty datasets cannot be chunked in HDF5 and are stored contiguously.
    """
    if not shape or 0 in shape:
        return None
    chunk = list(shape)
    axis = 0
    while np.prod(chunk, dtype=np.int64) * item_bytes > CHUNK_BYTES and axis < len(chunk):
        rest = int(np.prod(chunk[axis + 1:], dtype=np.int64)) * item_bytes
        chunk[axis] = max(1, CHUNK_BYTES // rest) if rest else 1
        axis += 1
    return tuple(chunk)
