"""The per-layer arrays of an extract file: growing them batch by batch, and reading them."""
from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import h5py
import numpy as np
import torch

from torchlog.errors import LayerNotFoundError, LogFileError, closest_matches
from torchlog.storage import files
from torchlog.storage.format import (
    CHUNK_BYTES,
    COMPLETE,
    EXTRACT_FORMAT_NAME,
    array_to_tensor,
    chunk_shape,
    dtype_from_name,
    dtype_name,
    is_bits_encoded,
    tensor_to_array,
)
from torchlog.storage.values import WriteOptions

__all__ = ["LAYERS", "BATCH_SIZES", "ORDER", "Appender", "ActivationFile"]

LAYERS = "layers"  # group: one dataset per layer, sample axis first
BATCH_SIZES = "batch_sizes"  # samples added by each finished batch
ORDER = "order"  # attribute of LAYERS: JSON list of the labels in execution order


class Appender:
    """Appends batches to the layer datasets of an open extract file, resuming where it stopped."""

    def __init__(self, file: h5py.File, path: str, options: WriteOptions) -> None:
        self._file = file
        self._path = path
        self._options = options
        self._layers = file[LAYERS]
        self._sizes = file[BATCH_SIZES]
        self._done = [int(n) for n in self._sizes[()]]  # sizes of the finished batches
        self._num_samples = sum(self._done)
        self._position = 0  # batches seen in this run
        for dataset in self._layers.values():  # drop a batch cut off by the interruption
            if dataset.shape[0] != self._num_samples:
                dataset.resize(self._num_samples, axis=0)

    def skip(self, num_samples: int) -> bool:
        """True when this batch was written by an earlier run (and so needs no forward pass).

        Raises:
            LogFileError: the earlier run's batch at this position had another size, so the
                inputs are not the ones it was extracting.
        """
        if self._position >= len(self._done):
            return False
        expected = self._done[self._position]
        if expected != num_samples:
            raise LogFileError(
                f"cannot resume {self._path!r}: batch {self._position} has {num_samples} samples "
                f"but the interrupted run wrote {expected}; the inputs differ (pass overwrite=True "
                "to start over)")
        self._position += 1
        return True

    def append(self, values: dict[str, Any], num_samples: int) -> None:
        """Append one batch: `values` maps each saved pass label to its activation.

        Raises:
            LogFileError: a value is not a tensor with `num_samples` rows, or the batch has
                other layers or per-sample shapes than the batches before it.
        """
        arrays = {label: self._array(label, value, num_samples) for label, value in values.items()}
        if ORDER not in self._layers.attrs:  # the first batch ever
            self._create(arrays, values)
        order = json.loads(self._layers.attrs[ORDER])
        if sorted(order) != sorted(values):
            raise LogFileError(
                f"batch {self._position} saved layers {sorted(values)} but earlier batches saved "
                f"{sorted(order)} (in {self._path!r}); extract needs a model whose selected layers "
                "run for every batch")
        end = self._num_samples + num_samples
        for label in order:
            array = arrays[label]
            dataset = self._layers[label]
            if array.shape[1:] != dataset.shape[1:]:
                raise LogFileError(
                    f"layer {label!r} gave per-sample shape {array.shape[1:]} in batch "
                    f"{self._position}, but {dataset.shape[1:]} before (in {self._path!r}); "
                    "extract needs fixed shapes: pad or crop the inputs")
            dataset.resize(end, axis=0)
            dataset[self._num_samples:end] = array
        self._sizes.resize((len(self._done) + 1,))
        self._sizes[-1] = num_samples
        self._done.append(num_samples)
        self._num_samples = end
        self._position += 1
        self._file.flush()

    def _array(self, label: str, value: Any, num_samples: int) -> np.ndarray:
        if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != num_samples:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise LogFileError(
                f"layer {label!r} gave {shape} for a batch of {num_samples} samples; extract "
                "needs layers whose output has the sample axis first")
        return tensor_to_array(value, f"layer {label!r}")

    def _create(self, arrays: dict[str, np.ndarray], values: dict[str, torch.Tensor]) -> None:
        for label, array in arrays.items():
            sample = array.shape[1:]
            rows = max(1, CHUNK_BYTES // max(1, int(np.prod(sample, dtype=np.int64)) * array.itemsize))
            dataset = self._layers.create_dataset(
                label, shape=(0, *sample), maxshape=(None, *sample), dtype=array.dtype,
                chunks=chunk_shape((rows, *sample), array.itemsize),
                compression=self._options.compression, compression_opts=self._options.compression_opts)
            dataset.attrs["torch_dtype"] = dtype_name(values[label].dtype)
        self._layers.attrs[ORDER] = json.dumps(list(arrays))


class ActivationFile(Mapping):
    """An extract file: `acts[label]` is that layer's numpy array over every sample written.

    Only finished batches are shown, so a file whose run was interrupted reads consistently.
    bfloat16 and other dtypes numpy lacks are returned as float32 by `[]` (exact values);
    `tensor(label)` gives the original dtype.
    """

    def __init__(self, path: Any) -> None:
        """Read the file's layer list.

        Raises:
            LogFileNotFoundError, LogFileError: missing, not an extract file, or newer format.
        """
        self.path = files.as_path(path)
        with files.open_existing(self.path) as file:
            self.is_complete = files.check_header(file, self.path, EXTRACT_FORMAT_NAME) == COMPLETE
            self.num_samples = int(np.sum(file[BATCH_SIZES][()]))
            layers = file[LAYERS]
            self.layers: list[str] = json.loads(layers.attrs[ORDER]) if ORDER in layers.attrs else []
            self.shapes = {k: (self.num_samples, *layers[k].shape[1:]) for k in self.layers}
            self.dtypes = {k: dtype_from_name(str(layers[k].attrs["torch_dtype"])) for k in self.layers}

    def tensor(self, label: str) -> torch.Tensor:
        """The layer as a tensor of its original dtype (bfloat16 included).

        Raises:
            LayerNotFoundError: the file has no such layer; the message lists close ones.
        """
        self._check(label)
        with files.open_existing(self.path) as file:
            try:
                return array_to_tensor(file[LAYERS][label][: self.num_samples], self.dtypes[label])
            except ValueError as exc:
                raise LogFileError(f"layer {label!r} in {self.path!r} is damaged: {exc}") from exc

    def __getitem__(self, label: str) -> np.ndarray:
        """The layer as a numpy array, samples first (see the class note on dtypes)."""
        tensor = self.tensor(label)
        return (tensor.float() if is_bits_encoded(tensor.dtype) else tensor).numpy()

    def _check(self, label: str) -> None:
        if label not in self.shapes:
            near = closest_matches(str(label), self.layers)
            hint = f"; closest: {', '.join(near)}" if near else ""
            raise LayerNotFoundError(
                f"no layer {label!r} in {self.path!r}; it holds {len(self.layers)} layers "
                f"({', '.join(self.layers[:8])}{', ...' if len(self.layers) > 8 else ''}){hint}")

    def __iter__(self) -> Iterator[str]:
        return iter(self.layers)

    def __len__(self) -> int:
        return len(self.layers)

    def __repr__(self) -> str:
        state = "" if self.is_complete else ", unfinished"
        layers = f"{len(self.layers)} layer{'' if len(self.layers) == 1 else 's'}"
        return f"<ActivationFile {self.path!r}: {layers} x {self.num_samples} samples{state}>"
