"""Tests of storage/metadata.py: what the records look like as JSON, and files of older formats."""
from __future__ import annotations

import json
from pathlib import Path

import h5py
import pytest
import torch

import torchlog
from tests.models import CreatedInside, WithBuffers
from tests.storage.compare import assert_same_history
from tests.torchlog.capture.test_partial import JoinsMismatched
from torchlog.errors import IncompleteLogWarning
from torchlog.records import NodeKind
from torchlog.storage.format import METADATA


def _rewrite_metadata(path: Path, change) -> None:
    with h5py.File(path, "r+") as file:
        doc = json.loads(file[METADATA].asstr()[()])
        change(doc)
        del file[METADATA]
        file.create_dataset(METADATA, data=json.dumps(doc), dtype=h5py.string_dtype())


def _as_older_format(doc: dict) -> None:
    """What files held before PassRecord.kind and the typed RunInfo fields."""
    for record in doc["passes"]:
        kind = record.pop("kind")
        for flag in ("input", "output", "buffer", "source", "created"):
            record[f"is_{flag}"] = kind == flag
        record["num_ops"], record["lookup_keys"] = 0, []
    info = doc["info"]
    hooks = info.pop("num_gradient_hooks")
    info["extra"] = {} if hooks is None else {"save_gradients": hooks}


def test_kind_is_stored_by_name(tmp_path: Path) -> None:
    history = torchlog.log_forward_pass(WithBuffers(), torch.rand(2, 4), random_seed=0)
    history.save(tmp_path / "run.h5")
    with h5py.File(tmp_path / "run.h5", "r") as file:
        doc = json.loads(file[METADATA].asstr()[()])
    assert [record["kind"] for record in doc["passes"]] == [p.kind.value for p in history]
    assert not any(key.startswith("is_") and key != "is_inplace" for key in doc["passes"][0])
    assert "extra" not in doc["info"] and "all_passes" not in doc["info"]


def test_files_of_the_older_format_load_with_kinds_and_hook_count(tmp_path: Path) -> None:
    x = torch.rand(2, 4, requires_grad=True)
    history = torchlog.log_forward_pass(CreatedInside(), x, random_seed=0, save_gradients=True)
    assert {p.kind for p in history} >= {NodeKind.INPUT, NodeKind.OUTPUT, NodeKind.CREATED, NodeKind.OP}
    history.save(tmp_path / "old.h5")
    _rewrite_metadata(tmp_path / "old.h5", _as_older_format)
    loaded = torchlog.load(tmp_path / "old.h5")
    assert [p.kind for p in loaded] == [p.kind for p in history]
    assert all(isinstance(p.kind, NodeKind) for p in loaded)
    assert loaded.info.num_gradient_hooks == history.info.num_gradient_hooks > 0
    assert_same_history(history, loaded)


def test_the_failed_op_is_stored_as_plain_json_and_read_back(tmp_path: Path) -> None:
    torch.manual_seed(0)
    path = tmp_path / "crash.h5"
    history = torchlog.log_forward_pass(JoinsMismatched(), torch.randn(2, 4), save_to=path, on_error="return")
    failed = history.info.failed_op
    assert failed is not None and failed.source_line.startswith("return torch.cat(")
    with h5py.File(path, "r") as file:
        stored = json.loads(file[METADATA].asstr()[()])["info"]["failed_op"]
    assert stored == {"func_name": "cat", "call_site": failed.call_site, "source_line": failed.source_line,
                      "args": [[[0, 0], [2, 4], "float32", failed.args[0].source],
                               [[0, 1], [1, 2, 4], "float32", failed.args[1].source]]}
    with pytest.warns(IncompleteLogWarning):
        loaded = torchlog.load(path)
    assert loaded.info.failed_op == failed
