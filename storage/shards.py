"""The shard files of a distributed extract, next to the target, and the target joining them.

Rank `r` of `n` writes `acts.shard{r}-of-{n}.h5` beside `acts.h5`, an extract file of
its own block of batches. Once every shard is finished, rank 0 writes `acts.h5` whose
layer datasets are HDF5 virtual datasets mapping each shard's rows, in rank order, so
row `i` is sample `i` and any HDF5 reader sees one array per layer. The target holds no
activations itself: the shards must stay next to it.
"""
from __future__ import annotations

import json
import os
import re

import h5py
import numpy as np

from torchlog.errors import LogFileError
from torchlog.storage import files
from torchlog.storage.arrays import BATCH_SIZES, LAYERS, ORDER, SELECTED
from torchlog.storage.format import COMPLETE, EXTRACT_FORMAT_NAME, FORMAT_VERSION

__all__ = ["shard_path", "find_shards", "other_runs", "remove_other_runs", "join_shards"]


def shard_path(target: str, rank: int, world_size: int) -> str:
    """Where rank `rank` of `world_size` writes its share of `target`.

    Example:
        >>> shard_path("/data/acts.h5", 1, 4)
        '/data/acts.shard1-of-4.h5'
    """
    stem, suffix = os.path.splitext(target)
    return f"{stem}.shard{rank}-of-{world_size}{suffix}"


def find_shards(target: str) -> dict[str, tuple[int, int]]:
    """Shard files next to `target` from any run: path -> (rank, world size)."""
    folder, name = os.path.split(os.path.abspath(target))
    stem, suffix = os.path.splitext(name)
    pattern = re.compile(rf"{re.escape(stem)}\.shard(\d+)-of-(\d+){re.escape(suffix)}")
    found = {}
    for entry in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
        match = pattern.fullmatch(entry)
        if match:
            found[os.path.join(folder, entry)] = (int(match[1]), int(match[2]))
    return found


def other_runs(target: str, world_size: int) -> str | None:
    """Why files next to `target` show that an earlier run used another world size, or None."""
    worlds = sorted({world for _, world in find_shards(target).values() if world != world_size})
    if worlds:
        names = [os.path.basename(p) for p, (_, w) in find_shards(target).items() if w == worlds[0]]
        return (f"shards {', '.join(names[:3])}{', ...' if len(names) > 3 else ''} next to it "
                f"come from a run with world size {worlds[0]}, and this run has world size "
                f"{world_size}; resume with {worlds[0]} processes in all")
    if world_size > 1 and os.path.exists(target) and h5py.is_hdf5(target):
        with files.open_existing(target) as file:
            found = int(file.attrs.get("world_size", "1"))
        if found != world_size:
            return (f"it was written by a run with world size {found}, and this run has world "
                    f"size {world_size}; resume with {found} process{'es' if found > 1 else ''} in all")
    return None


def remove_other_runs(target: str, world_size: int) -> None:
    """Delete the shards of runs with another world size, and a joined target (overwrite)."""
    for path, (_, world) in find_shards(target).items():
        if world != world_size:
            os.remove(path)
    if world_size > 1 and os.path.lexists(target):
        os.remove(target)


def join_shards(target: str, world_size: int, config: dict[str, str]) -> None:
    """Write `target` as virtual datasets over the finished shards of `world_size` ranks.

    The file appears whole: it is written under a temporary name, then renamed.

    Raises:
        LogFileError: a shard is missing or unfinished, or shards hold other layers,
            shapes or dtypes than rank 0's.
    """
    names, sizes, layouts, selected = [], [], {}, None
    for rank in range(world_size):
        path = shard_path(target, rank, world_size)
        with files.open_existing(path) as shard:
            if files.check_header(shard, path, EXTRACT_FORMAT_NAME) != COMPLETE:
                raise LogFileError(f"shard {path!r} is not finished; rerun the extract to finish it")
            names.append(os.path.basename(path))
            sizes.append(shard[BATCH_SIZES][()].astype(np.int64))
            layouts[rank] = _layers_of(shard)
            selected = selected or shard[LAYERS].attrs.get(SELECTED)  # which entry chose which layer
    _write_target(target, names, sizes, layouts, config, selected)


def _layers_of(shard: h5py.File) -> dict[str, tuple] | None:
    """label -> (shape, numpy dtype, torch dtype name) of a shard's layers; None when empty."""
    layers = shard[LAYERS]
    if ORDER not in layers.attrs:
        return None  # a rank that had no batch
    return {label: (layers[label].shape, layers[label].dtype, layers[label].attrs["torch_dtype"])
            for label in json.loads(layers.attrs[ORDER])}


def _write_target(target: str, names: list[str], sizes: list[np.ndarray], layouts: dict,
                  config: dict[str, str], selected: str | None) -> None:
    first = _common_layers(names, layouts)
    temporary = target + ".joining"
    with files.create(temporary, overwrite=True) as file:
        file.attrs.update({"format": EXTRACT_FORMAT_NAME, "format_version": FORMAT_VERSION,
                           "status": COMPLETE, **config, "shards": json.dumps(names)})
        group = file.create_group(LAYERS)
        file.create_dataset(BATCH_SIZES, data=np.concatenate(sizes or [np.zeros(0, np.int64)]))
        for label, (_, dtype, torch_dtype) in first.items():
            layout = _virtual_layer(label, dtype, names, sizes, layouts)
            group.create_virtual_dataset(label, layout).attrs["torch_dtype"] = torch_dtype
        if first:  # every shard empty: no layer, and no order, as in an empty extract file
            group.attrs[ORDER] = json.dumps(list(first))
        if selected:
            group.attrs[SELECTED] = selected
    os.replace(temporary, target)


def _common_layers(names: list[str], layouts: dict) -> dict[str, tuple]:
    """The layers every non-empty shard holds ({} when all are empty).

    Raises:
        LogFileError: two shards differ in labels, per-sample shapes or dtypes.
    """
    filled = [(rank, found) for rank, found in layouts.items() if found is not None]
    if not filled:
        return {}
    first_rank, first = filled[0]
    for rank, found in filled[1:]:
        if _describe(found) != _describe(first):
            raise LogFileError(
                f"shard {names[rank]!r} holds layers {_describe(found)}, but shard "
                f"{names[first_rank]!r} holds {_describe(first)}; rerun with overwrite=True")
    return first


def _virtual_layer(label: str, dtype: np.dtype, names: list[str], sizes: list[np.ndarray],
                   layouts: dict) -> h5py.VirtualLayout:
    """One layer over every shard's rows, in rank order: row i is sample i."""
    total = int(sum(rows.sum() for rows in sizes))
    shape = next(found[label][0] for found in layouts.values() if found is not None)
    layout = h5py.VirtualLayout(shape=(total, *shape[1:]), dtype=dtype)
    offset = 0
    for rank, rows in enumerate(sizes):
        count = int(rows.sum())
        if count:
            # Relative to the joined file's folder: the shards sit next to it.
            source = h5py.VirtualSource(names[rank], f"{LAYERS}/{label}", shape=layouts[rank][label][0])
            layout[offset:offset + count] = source[:count]
        offset += count
    return layout


def _describe(layers: dict) -> str:
    return ", ".join(f"{label} {tuple(shape[1:])} {torch_dtype}" for label, (shape, _, torch_dtype)
                     in layers.items())
