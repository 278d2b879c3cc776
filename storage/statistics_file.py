"""Statistics over a dataset as an HDF5 file: written by `Statistics.save`, read by `Statistics.load`.

Layout (root attribute `format` = 'torchlog-statistics'): `sites/<i>`, one group per site
in order, whose attributes hold the site (JSON: `{"kind": "str" | "int" | "text", "value":
...}`, a selector kept as its text), `count`, `shape`, `kept`, `ndim` (JSON), the site's
`dtype` and `device`, and one dataset per statistic; the root's `cka` attribute holds
`[[site, site, value], ...]` (JSON). This module moves plain values only: torchlog.datasets
turns them into a Statistics and back.

A checkpoint of a running `statistics` (root attribute `format` =
'torchlog-statistics-checkpoint') holds the accumulated state as it is, to resume from:
the root's `meta` attribute (JSON: what was asked and how far the run got) and a `state`
group with one dataset per named tensor, each with its dtype and shape unchanged.
"""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import torch

from torchlog.errors import LogFileError
from torchlog.storage import files
from torchlog.storage.format import COMPLETE, FORMAT_VERSION, STATISTICS_FORMAT_NAME, dtype_from_name, dtype_name

__all__ = ["CHECKPOINT_FORMAT_NAME", "read_checkpoint", "read_statistics", "write_checkpoint", "write_statistics"]

CHECKPOINT_FORMAT_NAME = "torchlog-statistics-checkpoint"
_SITES = "sites"
_STATE = "state"
_FIELDS = ("count", "shape", "kept", "ndim")


def write_statistics(path: Any, sites: list[dict[str, Any]], cka: list[tuple[Any, Any, float]],
                     overwrite: bool = False) -> str:
    """Write `sites` (each a dict: `site`, `count`, `shape`, `kept`, `ndim`, `dtype`,
    `device`, `values` {name: tensor}) and `cka` ((site, site, value) triples) to `path`.

    The file appears whole: it is written under a temporary name, then renamed, so an
    error leaves nothing at `path`.

    Returns:
        The path written, as str.

    Raises:
        LogFileExistsError: `path` exists and overwrite is False.
        LogFileNotFoundError, LogFilePermissionError, LogFileError: the path cannot be written.
    """
    path = files.check_new_path(path, overwrite)
    temporary = path + ".writing"
    try:
        with files.create(temporary, overwrite=True) as file:
            file.attrs.update({"format": STATISTICS_FORMAT_NAME, "format_version": FORMAT_VERSION,
                               "status": COMPLETE,
                               "cka": json.dumps([[_site_json(a), _site_json(b), float(v)] for a, b, v in cka])})
            group = file.create_group(_SITES)
            for i, found in enumerate(sites):
                _write_site(group.create_group(str(i)), found)
        os.replace(temporary, path)
    finally:
        if os.path.lexists(temporary):
            os.remove(temporary)
    return path


def read_statistics(path: Any) -> tuple[list[dict[str, Any]], list[tuple[Any, Any, float]]]:
    """The sites and CKA triples `write_statistics` wrote to `path` (tensors on the CPU).

    Raises:
        LogFileNotFoundError: there is no such file.
        LogFileError: not a statistics file (the message names how to open what it is),
            or a newer format version.
    """
    path = files.as_path(path)
    with files.open_existing(path) as file:
        files.check_header(file, path, STATISTICS_FORMAT_NAME)
        if _SITES not in file:
            raise LogFileError(f"{path!r} has no {_SITES!r} group: it was cut short while written")
        group = file[_SITES]
        sites = [_read_site(group[str(i)]) for i in range(len(group))]
        cka = [(_site_from_json(a), _site_from_json(b), float(v)) for a, b, v in json.loads(file.attrs["cka"])]
    return sites, cka


def write_checkpoint(path: Any, meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> str:
    """Write a checkpoint: `meta` (JSON-ready) and `tensors` (each kept exactly), replacing
    any file at `path` whole: written under a temporary name, then renamed, so an
    interruption leaves the previous checkpoint.

    Returns:
        The path written, as str.

    Raises:
        LogFileNotFoundError, LogFilePermissionError, LogFileError: the path cannot be written.
    """
    path = files.check_new_path(path, overwrite=True)
    temporary = path + ".writing"
    try:
        with files.create(temporary, overwrite=True) as file:
            file.attrs.update({"format": CHECKPOINT_FORMAT_NAME, "format_version": FORMAT_VERSION,
                               "status": COMPLETE, "meta": json.dumps(meta)})
            group = file.create_group(_STATE)
            for name, value in tensors.items():
                group.create_dataset(name, data=value.detach().cpu().numpy())
        os.replace(temporary, path)
    finally:
        if os.path.lexists(temporary):
            os.remove(temporary)
    return path


def read_checkpoint(path: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The meta and tensors `write_checkpoint` wrote to `path` (tensors on the CPU).

    Raises:
        LogFileNotFoundError: there is no such file.
        LogFileError: not a checkpoint (the message names how to open what it is).
    """
    path = files.as_path(path)
    with files.open_existing(path) as file:
        files.check_header(file, path, CHECKPOINT_FORMAT_NAME)
        if _STATE not in file:
            raise LogFileError(f"{path!r} has no {_STATE!r} group: it is not a whole checkpoint")
        meta = json.loads(file.attrs["meta"])
        tensors = {name: torch.from_numpy(np.asarray(dataset[()])) for name, dataset in file[_STATE].items()}
    return meta, tensors


def _write_site(group: Any, found: dict[str, Any]) -> None:
    group.attrs["site"] = _site_json(found["site"])
    for field in _FIELDS:
        group.attrs[field] = json.dumps(found[field])
    group.attrs["dtype"] = dtype_name(found["dtype"])
    group.attrs["device"] = str(found["device"])
    for name, value in found["values"].items():
        group.create_dataset(name, data=value.detach().cpu().numpy())


def _read_site(group: Any) -> dict[str, Any]:
    found = {field: json.loads(group.attrs[field]) for field in _FIELDS}
    found["shape"], found["kept"] = tuple(found["shape"]), tuple(found["kept"])
    found["site"] = _site_from_json(group.attrs["site"])
    found["dtype"] = dtype_from_name(group.attrs["dtype"])
    found["device"] = torch.device(group.attrs["device"])
    found["values"] = {name: torch.from_numpy(np.asarray(dataset[()])) for name, dataset in group.items()}
    return found


def _site_json(site: Any) -> str:
    """A site as JSON: a str or int as itself, anything else (a selector) as its text."""
    if isinstance(site, bool) or not isinstance(site, (str, int)):
        return json.dumps({"kind": "text", "value": repr(site)})
    return json.dumps({"kind": type(site).__name__, "value": site})


def _site_from_json(text: str) -> Any:
    return json.loads(text)["value"]
