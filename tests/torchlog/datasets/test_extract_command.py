"""Tests of torchlog/datasets/extract_command.py: `python -m torchlog extract` in one process, and its bad input."""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import torchlog
from tests.storage import extract_factories as factories
from torchlog.__main__ import main

FACTORIES = "tests.storage.extract_factories"


def _run(tmp_path: Path, *extra: str, model: str = f"{FACTORIES}:model",
         data: str = f"{FACTORIES}:data") -> int:
    return main(["extract", "--model", model, "--data", data, "--layers", "relu_1_2", "-1",
                 "--batch-size", "4", "--to", str(tmp_path / "acts.h5"), "--no-progress", *extra])


def test_one_process_writes_the_file_extract_writes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert _run(tmp_path) == 0
    assert "wrote <ActivationFile" in capsys.readouterr().out
    expected = torchlog.extract(factories.model(), factories.data(), ["relu_1_2", -1],
                                tmp_path / "api.h5", batch_size=4)
    acts = torchlog.storage.open_activations(tmp_path / "acts.h5")
    assert list(acts) == ["relu_1_2", "output_1_4"]  # '-1' is a position
    np.testing.assert_array_equal(acts["output_1_4"], expected["output_1_4"])


@pytest.mark.parametrize("flag, spec, message", [
    ("data", "no_such_package.data:make",
     "--data 'no_such_package.data:make': module 'no_such_package.data' cannot be imported "
     "(ModuleNotFoundError: No module named 'no_such_package'); it must be importable"),
    ("data", f"{FACTORIES}", f"--data '{FACTORIES}' is not MODULE:FUNCTION"),
    ("data", f"{FACTORIES}:missing", f"--data '{FACTORIES}:missing': module '{FACTORIES}' has no 'missing'"),
    ("data", f"{FACTORIES}:LAYERS", f"--data '{FACTORIES}:LAYERS' names a list, not a function"),
    ("model", f"{FACTORIES}:data", f"--model '{FACTORIES}:data' returned Samples, not a torch.nn.Module"),
])
def test_bad_factories_are_named_and_nothing_is_overwritten(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                            flag: str, spec: str, message: str) -> None:
    assert _run(tmp_path) == 0
    before = (tmp_path / "acts.h5").read_bytes()
    capsys.readouterr()
    assert _run(tmp_path, "--overwrite", **{flag: spec}) == 1
    assert message in capsys.readouterr().err
    assert (tmp_path / "acts.h5").read_bytes() == before


def test_a_layer_that_selects_nothing_is_refused_before_the_file_is_replaced(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert _run(tmp_path) == 0
    before = (tmp_path / "acts.h5").read_bytes()
    status = main(["extract", "--model", f"{FACTORIES}:model", "--data", f"{FACTORIES}:data",
                   "--layers", "conv2d", "--batch-size", "4", "--to", str(tmp_path / "acts.h5"),
                   "--overwrite", "--no-progress"])
    assert status == 1
    assert "site 'conv2d' matches no layer" in capsys.readouterr().err
    assert (tmp_path / "acts.h5").read_bytes() == before


def test_stop_after_ends_each_batch_as_extract_does(tmp_path: Path) -> None:
    assert main(["extract", "--model", f"{FACTORIES}:model", "--data", f"{FACTORIES}:data", "--layers",
                 "relu_1_2", "--batch-size", "4", "--to", str(tmp_path / "acts.h5"), "--no-progress",
                 "--stop-after", "relu_1_2"]) == 0
    expected = torchlog.extract(factories.model(), factories.data(), ["relu_1_2"], tmp_path / "api.h5",
                                batch_size=4)
    acts = torchlog.storage.open_activations(tmp_path / "acts.h5")
    assert list(acts) == ["relu_1_2"]
    np.testing.assert_array_equal(acts["relu_1_2"], expected["relu_1_2"])
    with h5py.File(tmp_path / "acts.h5", "r") as file:
        assert file.attrs["stop_after"] == '"relu_1_2"'


def test_a_batch_running_other_ops_is_refused_unless_changed_ops_by_place(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture) -> None:
    model = f"{FACTORIES}:early_changing_model"
    assert _run(tmp_path, model=model) == 1
    assert ("batch 10 ran other ops than the first batch before a chosen site: after 0 equal calls it ran 'mul' "
            "where the first batch ran 'linear'") in capsys.readouterr().err
    with pytest.warns(torchlog.OpSequenceChangedWarning, match="batch 10 ran other ops"):
        assert _run(tmp_path, "--overwrite", "--changed-ops", "by_place", model=model) == 0
    acts = torchlog.storage.open_activations(tmp_path / "acts.h5")
    net, samples = factories.model(), factories.data().values
    with torch.no_grad():  # the oracle: the plain computation (x * 1 changes no value)
        hidden = torch.relu(net.fc1(samples))
        np.testing.assert_allclose(acts["relu_1_2"], hidden.numpy(), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(acts[-1], net.fc2(hidden).numpy(), rtol=1e-6, atol=1e-6)
