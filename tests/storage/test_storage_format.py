"""Tests of storage/format.py: every torch dtype round-trips bit for bit; chunk shapes."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.storage.compare import ALL_DTYPES, random_bits, same_bits
from torchlog.errors import InvalidArgumentTypeError
from torchlog.storage.format import (
    CHUNK_BYTES,
    array_to_tensor,
    chunk_shape,
    dtype_from_name,
    dtype_name,
    is_bits_encoded,
    tensor_to_array,
)

@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_name)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (5,), (2, 3, 4)], ids=str)
def test_every_dtype_and_shape_round_trips_exactly(dtype: torch.dtype, shape: tuple) -> None:
    tensor = random_bits(shape, dtype)
    array = tensor_to_array(tensor, "x")
    back = array_to_tensor(array, dtype)
    assert same_bits(tensor, back)
    assert array.dtype.kind in "biufc"  # something every HDF5 reader understands


def test_numpy_native_dtypes_are_stored_as_themselves_and_others_as_bits() -> None:
    assert tensor_to_array(torch.ones(2, dtype=torch.float16), "x").dtype == np.float16
    assert tensor_to_array(torch.ones(2, dtype=torch.bfloat16), "x").dtype == np.uint16
    assert tensor_to_array(torch.ones(2, dtype=torch.bool), "x").dtype == np.bool_
    assert is_bits_encoded(torch.bfloat16) and not is_bits_encoded(torch.complex64)


def test_views_conjugates_and_grad_tensors_are_stored_as_their_values() -> None:
    base = torch.arange(12.0, requires_grad=True).reshape(3, 4)
    strided = base.t()[1:]
    assert torch.equal(array_to_tensor(tensor_to_array(strided, "x"), torch.float32), strided.detach())
    z = torch.tensor([1 + 2j, 3 - 1j]).conj()
    assert torch.equal(array_to_tensor(tensor_to_array(z, "x"), torch.complex64), z.resolve_conj())


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_tensors_without_dense_values_are_refused_by_name() -> None:
    with pytest.raises(InvalidArgumentTypeError, match="layer x.*to_dense"):
        tensor_to_array(torch.eye(3).to_sparse(), "layer x")
    q = torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8)
    with pytest.raises(InvalidArgumentTypeError, match="quantized"):
        tensor_to_array(q, "layer x")


def test_dtype_names_round_trip_and_unknown_names_are_refused() -> None:
    for dtype in ALL_DTYPES:
        assert dtype_from_name(dtype_name(dtype)) is dtype
    with pytest.raises(ValueError, match="'__import__'"):
        dtype_from_name("__import__")


@pytest.mark.parametrize("shape", [(7,), (1000, 1000), (64, 256, 56, 56), (3, 5000, 5000), (2, 2)])
def test_chunks_cover_the_shape_and_stay_near_the_target_size(shape: tuple) -> None:
    chunks = chunk_shape(shape, 4)
    assert len(chunks) == len(shape)
    assert all(1 <= c <= s for c, s in zip(chunks, shape))
    nbytes = int(np.prod(chunks)) * 4
    assert nbytes <= max(CHUNK_BYTES, 4 * shape[-1])
    if int(np.prod(shape)) * 4 <= CHUNK_BYTES:
        assert chunks == shape  # small tensors are one chunk


def test_scalars_and_empty_tensors_are_not_chunked() -> None:
    assert chunk_shape((), 4) is None
    assert chunk_shape((3, 0), 4) is None
