"""Tests of storage/values.py: every value activation_postfunc may return, through a real file."""
from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from tests.storage.compare import ALL_DTYPES, random_bits, same_bits, same_value
from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError, LogFileError
from torchlog.storage.format import dtype_name
from torchlog.storage.values import WriteOptions, read_value, write_value


@pytest.fixture
def h5(tmp_path):
    with h5py.File(tmp_path / "values.h5", "w") as file:
        yield file


def _round_trip(h5: h5py.File, value: object, options: WriteOptions | None = None) -> object:
    name = str(len(h5))
    write_value(h5, name, value, "the value", options or WriteOptions())
    return read_value(h5[name], "values.h5")


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_name)
def test_tensors_of_every_dtype_round_trip_through_hdf5(h5: h5py.File, dtype: torch.dtype) -> None:
    for shape in [(), (0,), (2, 0), (7,), (3, 4, 5)]:
        tensor = random_bits(shape, dtype)
        back = _round_trip(h5, tensor)
        assert same_bits(tensor, back), (dtype, shape)


def test_bfloat16_is_stored_as_uint16_bits_with_its_dtype_named(h5: h5py.File) -> None:
    tensor = torch.tensor([1.5, -2.0, float("nan")], dtype=torch.bfloat16)
    write_value(h5, "x", tensor, "x", WriteOptions())
    assert h5["x"].dtype == np.uint16
    assert h5["x"].attrs["torch_dtype"] == "bfloat16"
    assert np.array_equal(h5["x"][()], tensor.view(torch.int16).numpy().view(np.uint16))


@pytest.mark.parametrize("value", [
    None, True, 3, -2**63, 2.5, float("inf"), 1 + 2j, "text with / and ünïcode", "",
    np.arange(6, dtype=np.int16).reshape(2, 3), np.ones(()), np.float64(1.25), np.int8(-3), np.bool_(True),
    [torch.ones(2), 3], (torch.zeros(()), "a", None), {"a/b": torch.arange(3), "": [1, (2.0,)]},
    [], (), {},
], ids=repr)
def test_values_postfuncs_may_return_round_trip(h5: h5py.File, value: object) -> None:
    back = _round_trip(h5, value)
    assert same_value(np.asarray(value).tolist() if isinstance(value, np.ndarray) else value,
                      np.asarray(back).tolist() if isinstance(back, np.ndarray) else back)
    assert type(back) is type(value)


@pytest.mark.parametrize("value, shown", [
    (object(), "object"), ({1: torch.ones(1)}, "dict"), (2**64, "too large"),
    (np.array(["a", "b"]), "numpy value of dtype <U1"), ([1, {3}], r"the value\[1\]"),
    (b"bytes", "bytes"),
])
def test_values_that_cannot_be_stored_are_refused_by_name(h5: h5py.File, value: object, shown: str) -> None:
    with pytest.raises(InvalidArgumentTypeError, match=shown):
        write_value(h5, "x", value, "the value", WriteOptions())


@pytest.mark.parametrize("compression", ["gzip", "lzf"])
def test_compressed_datasets_read_back_the_same(h5: h5py.File, compression: str) -> None:
    tensor = torch.zeros(300, 300)
    tensor[::7] = torch.rand(43, 300)
    back = _round_trip(h5, tensor, WriteOptions(compression))
    assert torch.equal(back, tensor)
    assert h5["0"].compression == compression
    assert h5["0"].id.get_storage_size() < tensor.numel() * 4


def test_bad_compression_options_are_refused() -> None:
    with pytest.raises(InvalidOptionError, match="'zip'"):
        WriteOptions("zip")
    with pytest.raises(InvalidOptionError, match="gzip"):
        WriteOptions("lzf", 4)


def test_a_tensor_whose_data_has_another_dtype_is_a_log_file_error(h5: h5py.File) -> None:
    write_value(h5, "x", torch.ones(3, dtype=torch.bfloat16), "x", WriteOptions())
    h5["x"].attrs["torch_dtype"] = "float32"  # as if the file were damaged
    with pytest.raises(LogFileError, match="'/x' in 'values.h5' is damaged: a torch.float32 tensor .* uint16"):
        read_value(h5["x"], "values.h5")


def test_objects_of_unknown_kind_are_a_log_file_error(h5: h5py.File) -> None:
    h5["foreign"] = np.ones(3)
    with pytest.raises(LogFileError, match="'/foreign' in 'values.h5' has kind None"):
        read_value(h5["foreign"], "values.h5")
