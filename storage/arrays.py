"""The per-layer arrays of an extract file: growing them batch by batch, and reading them."""
from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from time import perf_counter
from typing import Any

import h5py
from h5py import h5s
import numpy as np
import torch

from torchlog.errors import LayerNotFoundError, LogFileError, closest_matches
from torchlog.storage import files
from torchlog.storage.format import (
    COMPLETE,
    EXTRACT_FORMAT_NAME,
    array_to_tensor,
    dtype_from_name,
    dtype_name,
    is_bits_encoded,
    tensor_to_array,
)
from torchlog.storage.values import WriteOptions

__all__ = ["LAYERS", "BATCH_SIZES", "ORDER", "SELECTED", "Appender", "ActivationFile"]

LAYERS = "layers"  # group: one dataset per layer, sample axis first
BATCH_SIZES = "batch_sizes"  # samples added by each finished batch
ORDER = "order"  # attribute of LAYERS: JSON list of the labels in execution order
# Attribute of LAYERS: JSON list of [entry, [labels]], each `layers` entry extract was given
# with the labels it selected (absent in files written before it was recorded).
SELECTED = "selected"
_CHUNK_CACHE_BYTES = 1 << 20  # HDF5's default chunk cache per dataset
_ONE = h5s.create_simple((1,))  # the memory space of one batch size


class Appender:
    """Appends batches to the layer datasets of an open extract file, after the ones it holds.

    With `num_samples` known, each layer is allocated whole on the first batch and stored
    contiguously (`chunks` None or False) or in chunks; else it grows batch by batch in
    chunks. Chunks hold whole batches (`chunks` None or True) or `chunks` samples (an int).
    `write_seconds` and `write_bytes` add up what the writes cost.
    """

    def __init__(self, file: h5py.File, path: str, options: WriteOptions,
                 num_samples: int | None = None, chunks: bool | int | None = None) -> None:
        self._file = file
        self._path = path
        self._options = options
        self._total = num_samples
        self._chunks = chunks
        self._layers = file[LAYERS]
        self._sizes = file[BATCH_SIZES]
        self._done = [int(n) for n in self._sizes[()]]  # sizes of the finished batches
        self._num_samples = sum(self._done)
        self._order: list[str] | None = None  # the layers, once the first batch made them
        self._datasets: dict[str, h5py.Dataset] = {}
        self._dtypes: dict[str, np.dtype] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._growing: dict[str, bool] = {}
        self.write_seconds = 0.0
        self.write_bytes = 0
        for dataset in self._layers.values():  # drop a batch cut off by the interruption
            if dataset.maxshape[0] is None and dataset.shape[0] != self._num_samples:
                dataset.resize(self._num_samples, axis=0)

    @property
    def num_batches(self) -> int:
        """Batches the file holds."""
        return len(self._done)

    def append(self, values: dict[str, Any], num_samples: int, index: int | None = None) -> None:
        """Append one batch: `values` maps each saved pass label to its activation, in
        execution order; `index` numbers the batch in messages (default: its place here).

        Raises:
            LogFileError: a value is not a tensor with `num_samples` rows, or the batch has
                other layers or per-sample shapes than the batches before it, or more
                samples come than `num_samples` announced.
        """
        index = len(self._done) if index is None else index
        arrays = {label: self._array(label, value, num_samples) for label, value in values.items()}
        started = perf_counter()
        order = self._layer_order(arrays, values)
        if len(order) != len(values) or any(label not in values for label in order):
            raise LogFileError(
                f"batch {index} saved layers {sorted(values)} but earlier batches saved "
                f"{sorted(order)} (in {self._path!r}); extract needs a model whose selected layers "
                "run for every batch")
        end = self._num_samples + num_samples
        for label in order:
            self._write(self._datasets[label], label, arrays[label], end, index)
        self._sizes.resize((len(self._done) + 1,))
        # Low-level, as for the layers: h5py's `[-1] =` costs about 0.17 ms of a small batch.
        space = self._sizes.id.get_space()
        space.select_hyperslab((len(self._done),), (1,))
        self._sizes.id.write(_ONE, space, np.array([num_samples], dtype=np.int64))
        self._done.append(num_samples)
        self._num_samples = end
        self._file.flush()
        self.write_seconds += perf_counter() - started
        self.write_bytes += sum(a.nbytes for a in arrays.values())

    def _layer_order(self, arrays: dict[str, np.ndarray], values: dict[str, torch.Tensor]) -> list[str]:
        """The file's layers in execution order, made from the first batch ever."""
        if self._order is None:
            if ORDER not in self._layers.attrs:
                self._create(arrays, values)
            self._order = json.loads(self._layers.attrs[ORDER])
            self._datasets = {label: self._layers[label] for label in self._order}
            self._dtypes = {label: dataset.dtype for label, dataset in self._datasets.items()}
            # h5py reads these from HDF5 on every access; the per-sample shapes, the rows of a
            # fixed-size layer and whether a layer grows never change while appending.
            self._shapes = {label: dataset.shape for label, dataset in self._datasets.items()}
            self._growing = {label: dataset.maxshape[0] is None for label, dataset in self._datasets.items()}
        return self._order

    def _write(self, dataset: h5py.Dataset, label: str, array: np.ndarray, end: int, index: int) -> None:
        shape = self._shapes[label]  # its first axis only for fixed-size layers
        if array.dtype != self._dtypes[label]:
            raise LogFileError(
                f"layer {label!r} gave {array.dtype} values in batch {index}, but "
                f"{self._dtypes[label]} before (in {self._path!r}); extract needs one dtype per layer")
        if array.shape[1:] != shape[1:]:
            raise LogFileError(
                f"layer {label!r} gave per-sample shape {array.shape[1:]} in batch {index}, but "
                f"{shape[1:]} before (in {self._path!r}); extract needs fixed shapes: "
                "pad or crop the inputs")
        if self._growing[label]:
            dataset.resize(end, axis=0)
        elif end > shape[0]:
            raise LogFileError(
                f"batch {index} ends at sample {end}, but {self._path!r} was laid out for "
                f"{shape[0]} samples; the inputs changed since the run that made it "
                "(pass overwrite=True to start over)")
        # The low-level write skips h5py's checks of the value (it is an exact array already).
        space = dataset.id.get_space()
        space.select_hyperslab((self._num_samples, *(0,) * (array.ndim - 1)), array.shape)
        dataset.id.write(h5s.create_simple(array.shape), space, array)

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
            growing = self._total is None  # else allocated whole, its size fixed
            dataset = self._layers.create_dataset(
                label, shape=(0 if growing else self._total, *sample),
                maxshape=(None, *sample) if growing else None,
                dtype=array.dtype, chunks=self._chunk_shape(array),
                compression=self._options.compression, compression_opts=self._options.compression_opts)
            dataset.attrs["torch_dtype"] = dtype_name(values[label].dtype)
        self._layers.attrs[ORDER] = json.dumps(list(arrays))

    def _chunk_shape(self, array: np.ndarray) -> tuple[int, ...] | None:
        """None (contiguous: the least CPU per MB in bench/extract_bench.py) when the size is
        known, unless chunks or a compression are asked; else chunks of whole batches (one,
        or as many as fit in HDF5's 1 MiB chunk cache), so no batch reads a chunk back."""
        if self._chunks is False or (self._chunks is None and self._total is not None
                                     and self._options.compression is None):
            return None
        sample_bytes = max(1, int(np.prod(array.shape[1:], dtype=np.int64)) * array.itemsize)
        if isinstance(self._chunks, int) and not isinstance(self._chunks, bool):
            rows = self._chunks
        else:
            batch = max(1, len(array))  # the first batch's size sets the unit
            rows = batch * max(1, _CHUNK_CACHE_BYTES // (batch * sample_bytes))
        if self._total is not None:  # a fixed-size axis cannot have longer chunks
            rows = min(rows, max(1, self._total))
        return (rows, *array.shape[1:])


class ActivationFile(Mapping):
    """An extract file: `acts[label]` is that layer's numpy array over every sample written.

    Iterating gives the labels, in execution order. A key may also be an entry of the
    `layers` extract was given (`acts['fc1']`) when it selected one layer; `selected`
    maps each entry to the labels it chose, and `labels_for(key)` resolves either form.

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
            # An entry (str, or int for a position) -> the labels it selected, in order.
            self.selected: dict[str | int, list[str]] = {
                entry: labels for entry, labels in json.loads(layers.attrs.get(SELECTED, "[]"))}
            self.shapes = {k: (self.num_samples, *layers[k].shape[1:]) for k in self.layers}
            self.dtypes = {k: dtype_from_name(str(layers[k].attrs["torch_dtype"])) for k in self.layers}
            for label in self.layers:
                _check_sources(layers[label], label, self.path)

    def labels_for(self, key: str | int) -> list[str]:
        """The labels `key` names: a label names itself, a `layers` entry given to extract
        (module address, substring, position) the layers it selected, in execution order.

        Raises:
            LayerNotFoundError: `key` is neither; the message lists the labels, the entries
                and the closest of them.

        Example:
            >>> import tempfile, os, torch, torchlog
            >>> path = os.path.join(tempfile.mkdtemp(), "acts.h5")
            >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
            >>> acts = torchlog.extract(net, torch.rand(6, 3), ["0", "relu"], path, batch_size=4)
            >>> acts.labels_for("0"), acts["relu"].shape
            (['linear_1_1'], (6, 4))
        """
        if isinstance(key, str) and key in self.shapes:
            return [key]
        if isinstance(key, (str, int)) and not isinstance(key, bool) and key in self.selected:
            return list(self.selected[key])
        raise self._unknown(key)

    def tensor(self, key: str | int) -> torch.Tensor:
        """The layer as a tensor of its original dtype (bfloat16 included); `key` is its
        label or a `layers` entry that selected that one layer (see labels_for).

        Raises:
            LayerNotFoundError: the file has no such layer, or `key` selected several; the
                message lists them, or the close ones.
        """
        label = self._check(key)
        with files.open_existing(self.path) as file:
            try:
                return array_to_tensor(file[LAYERS][label][: self.num_samples], self.dtypes[label])
            except ValueError as exc:
                raise LogFileError(f"layer {label!r} in {self.path!r} is damaged: {exc}") from exc

    def __getitem__(self, key: str | int) -> np.ndarray:
        """The layer as a numpy array, samples first (see the class note on dtypes); `key`
        as for `tensor`."""
        tensor = self.tensor(key)
        return (tensor.float() if is_bits_encoded(tensor.dtype) else tensor).numpy()

    def __contains__(self, key: object) -> bool:
        """Whether `acts[key]` finds one layer (read nothing)."""
        try:
            return len(self.labels_for(key)) == 1  # type: ignore[arg-type]
        except LayerNotFoundError:
            return False

    def _check(self, key: str | int) -> str:
        """The one label `key` names."""
        labels = self.labels_for(key)
        if len(labels) != 1:
            raise LayerNotFoundError(
                f"{key!r} selected {len(labels)} layers of {self.path!r} ({', '.join(labels)}); "
                f"read one of them by label, or all with ActivationDataset(path, layers=[{key!r}])")
        return labels[0]

    def _unknown(self, key: Any) -> LayerNotFoundError:
        held = f"{', '.join(self.layers[:8])}{', ...' if len(self.layers) > 8 else ''}"
        entries, how = "", "name a layer by its label"
        if self.selected:
            chosen = [f"{entry!r} ({len(labels)} layer{'' if len(labels) == 1 else 's'})"
                      for entry, labels in self.selected.items()]
            entries = f", chosen by the entries extract took: {', '.join(chosen)}"
            how += " or by one of those entries"
        near = closest_matches(str(key), self.layers + [e for e in self.selected if isinstance(e, str)])
        hint = f"; closest: {', '.join(near)}" if near else ""
        return LayerNotFoundError(
            f"no layer {key!r} in {self.path!r}; it holds {len(self.layers)} layers ({held}){entries}; "
            f"{how}{hint}")

    def __iter__(self) -> Iterator[str]:
        return iter(self.layers)

    def __len__(self) -> int:
        return len(self.layers)

    def __repr__(self) -> str:
        state = "" if self.is_complete else ", unfinished"
        layers = f"{len(self.layers)} layer{'' if len(self.layers) == 1 else 's'}"
        return f"<ActivationFile {self.path!r}: {layers} x {self.num_samples} samples{state}>"


def _check_sources(dataset: h5py.Dataset, label: str, path: str) -> None:
    """A joined file's layer reads from shard files: HDF5 fills rows of a missing one with
    zeros, silently, so refuse to open it instead.

    Raises:
        LogFileError: a shard the layer reads from is not next to the file.
    """
    if not dataset.is_virtual:
        return
    folder = os.path.dirname(os.path.abspath(path))
    for source in dataset.virtual_sources():
        if not os.path.exists(os.path.join(folder, source.file_name)):
            raise LogFileError(
                f"layer {label!r} of {path!r} reads from the shard {source.file_name!r}, which is "
                f"not in {folder!r}; the joined file holds no data itself: keep the shards next "
                "to it (move or copy them together)")
