"""The Statistics result: its exports, and its hand-off to interventions."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import torchlog
from torchlog.datasets import covariance, keep, statistics
from torchlog.errors import InvalidOptionError


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2))


def test_mean_ablation_replaces_the_value_with_the_dataset_mean() -> None:
    model = _mlp()
    data = torch.randn(40, 4)
    found = statistics(model, data, ["0"], stats=["mean"], batch_size=16, progress=False)
    x = torch.randn(3, 4)
    out = torchlog.run(model, x, intervene={"0": found.mean_ablate("0")}).output
    with torch.no_grad():
        mean = model[0](data).mean(dim=0)
        expected = model[2](model[1](mean)).expand(3, 2)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_mean_ablation_of_cnn_channels_broadcasts_over_positions() -> None:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU())
    data = torch.randn(10, 1, 6, 6)
    found = statistics(model, data, ["0"], stats=["mean"], reduce=keep(1), batch_size=4, progress=False)
    out = torchlog.run(model, torch.randn(2, 1, 6, 6), intervene={"0": found.mean_ablate("0")}).output
    with torch.no_grad():
        channel_means = model[0](data).mean(dim=(0, 2, 3))
    expected = channel_means.relu().view(1, 3, 1, 1).expand(2, 3, 4, 4)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_project_out_removes_the_top_principal_direction() -> None:
    model = _mlp()
    data = torch.randn(200, 4)
    found = statistics(model, data, ["0"], stats=[covariance(2)], batch_size=50, progress=False)
    x = torch.randn(6, 4)
    action = found.project_out("0", component=0)
    out = torchlog.run(model, x, intervene={"0": action}).output
    unit = found["0"].components[0].float()
    with torch.no_grad():
        h = model[0](x)
        expected = model[2](model[1](h - (h @ unit)[:, None] * unit))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(InvalidOptionError, match="has 2 principal components, so component=5"):
        found.project_out("0", component=5)


def test_project_out_needs_one_kept_dimension() -> None:
    model = _mlp()
    found = statistics(model, torch.randn(8, 4), ["0"], stats=[covariance(1)], reduce="all", progress=False)
    with pytest.raises(InvalidOptionError, match=r"kept dimensions \(\); compute its statistics"):
        found.project_out("0")


def test_exports_hold_the_same_numbers() -> None:
    model = _mlp()
    found = statistics(model, torch.randn(30, 4), ["0", "2"], stats=["mean", "std", "zeros"], batch_size=7,
                       progress=False)
    arrays = found.to_numpy()
    assert set(arrays) == {"0", "2"} and int(arrays["0"]["count"]) == 30
    np.testing.assert_array_equal(arrays["2"]["std"], found["2"].std.numpy())
    assert torch.equal(found.tensors()["0"]["mean"], found["0"].mean)
    pandas = pytest.importorskip("pandas")
    frame = found.to_pandas()
    assert isinstance(frame, pandas.DataFrame) and len(frame) == 5 + 2
    row = frame[(frame.site == "2") & (frame.feature == (1,))].iloc[0]
    assert row["mean"] == pytest.approx(float(found["2"].mean[1])) and row["count"] == 30


def test_unknown_names_say_what_exists() -> None:
    found = statistics(_mlp(), torch.randn(4, 4), ["0"], stats=["mean"], progress=False)
    with pytest.raises(AttributeError, match=r"site '0' has no statistic 'var'; it has \['mean'\]"):
        found["0"].var
    with pytest.raises(KeyError, match="no statistics for site '9'"):
        found["9"]
