"""The viewer's bar charts, histograms and grid given through Annotations, as the page carries
them, and a clear error for each bad input, naming the value."""
from __future__ import annotations

import json
import re
from typing import Any

import pytest
import torch
from torch import nn

import torchlog
from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError, LayerNotFoundError
from torchlog.vis.viewer import Annotations, Grid, page_html


@pytest.fixture(scope="module")
def history() -> torchlog.ModelHistory:
    torch.manual_seed(0)
    return torchlog.log_forward_pass(nn.Sequential(nn.Linear(3, 3), nn.ReLU()), torch.randn(2, 3))


def _data(page: str) -> dict[str, Any]:
    found = re.search(r'<script id="torchlog-data" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(found.group(1))


def test_the_page_carries_bars_histograms_and_the_grid(history) -> None:
    notes = Annotations(bars={"relu_1_2": {"effect by position": {"0": 0.25, "1": -0.5}}},
                        histograms={"linear_1_1": {"run b": (-1.0, 2.0, [1, 0, 5])}},
                        grid=Grid("effect", ["linear_1_1", "relu_1_2"], ["0", "1"], [[0.1, None], [0.0, -0.5]]))
    data = _data(page_html(history, annotations=notes))
    assert data["bars"] == {"layouts": [["effect by position", ["0", "1"]]], "passes": {"relu_1_2": [[0, [0.25, -0.5]]]}}
    assert data["histograms"] == {"linear_1_1": {"run b": {"lo": -1.0, "hi": 2.0, "counts": [1, 0, 5]}}}
    assert data["grid"] == {"title": "effect", "rows": ["linear_1_1", "relu_1_2"], "columns": ["0", "1"],
                            "values": [[0.1, None], [0.0, -0.5]]}
    assert "grid" not in _data(page_html(history))


@pytest.mark.parametrize("given, error, names", [
    (Annotations(bars={"relu_1_2": {"effect": {"0": "high"}}}), InvalidArgumentTypeError, "'high'"),
    (Annotations(bars={"relu_9_9": {"effect": {"0": 1.0}}}), LayerNotFoundError, "relu_9_9"),
    (Annotations(histograms={"relu_1_2": {"run b": (0.0, 1.0)}}), InvalidArgumentTypeError, r"\(lo, hi, counts\)"),
    (Annotations(histograms={"relu_1_2": {"run b": (2.0, 1.0, [1])}}), InvalidOptionError, "lo 2.0, hi 1.0"),
    (Annotations(histograms={"relu_1_2": {"run b": (0.0, 1.0, [1, -2])}}), InvalidOptionError, r"\[1, -2\]"),
    (Annotations(grid={"rows": []}), InvalidArgumentTypeError, "Grid, got dict"),
    (Annotations(grid=Grid("e", ["relu_1_2"], ["0", "1"], [[0.5]])), InvalidOptionError, "1 values for 2 columns"),
    (Annotations(grid=Grid("e", ["relu_1_2"], ["0"], [[0.5], [0.1]])), InvalidOptionError, "2 rows for 1 Grid.rows"),
    (Annotations(grid=Grid("e", ["relu_1_2"], ["0"], [[float("nan")]])), InvalidOptionError, "nan"),
    (Annotations(grid=Grid("e", ["relu_1_2"], ["0"], [["x"]])), InvalidArgumentTypeError, "'x'"),
    (Annotations(grid=Grid("e", ["relu_1_3"], ["0"], [[0.5]])), LayerNotFoundError, "relu_1_3"),
])
def test_bad_charts_are_refused_naming_the_value(history, given, error, names) -> None:
    with pytest.raises(error, match=names):
        page_html(history, annotations=given)
