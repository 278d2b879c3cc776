"""Histograms with bins learned from the data against numpy's histogram over every value with the same edges."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from torchlog.datasets import StatisticsSink, histogram, run_dataset, statistics
from torchlog.datasets.learned_histograms import LearnedHistogramCounts
from torchlog.errors import InvalidOptionError

NUM_BINS = 16


class Scaled(nn.Module):
    """x @ w, each output feature on its own scale and offset (1e-6 to 1e4)."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.weight = nn.Parameter(torch.randn(4, 5, generator=generator, dtype=torch.float64))
        self.scale = torch.tensor([1e-6, 1.0, 3.0, 1e4, 0.0], dtype=torch.float64)
        self.offset = torch.tensor([0.0, -7.5, 100.0, 0.0, 2.0], dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.weight) * self.scale + self.offset


def _batches() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(n, 4, generator=generator, dtype=torch.float64) for n in (9, 1, 30, 4, 17, 12)]


def _values(batches: list[torch.Tensor]) -> np.ndarray:
    model = Scaled()
    with torch.no_grad():
        return torch.cat([model(b) for b in batches]).numpy()


def test_learned_bins_equal_numpy_over_the_same_edges_and_lose_no_value() -> None:
    batches = _batches()
    found = statistics(Scaled(), batches, [-1], stats=["mean", histogram(num_bins=NUM_BINS)], progress=False)[-1]
    values = _values(batches)
    assert found.histogram.shape == (5, NUM_BINS) and found.histogram_edges.shape == (5, NUM_BINS + 1)
    for k in range(5):
        edges = found.histogram_edges[k].numpy()
        counts, _ = np.histogram(values[:, k], bins=edges)
        assert found.histogram[k].tolist() == counts.tolist()
        assert int(found.histogram[k].sum()) == len(values)  # every value in a bin
        assert edges[0] <= values[:, k].min() and values[:, k].max() < edges[-1]
        width = edges[1] - edges[0]
        assert np.log2(width) == np.round(np.log2(width))  # a power of two
        if values[:, k].max() > values[:, k].min():  # no narrower grid of powers of two fits
            half = width / 2
            assert np.floor(values[:, k].max() / half) - np.floor(values[:, k].min() / half) > NUM_BINS - 1
    assert int(found.below.sum()) == int(found.above.sum()) == 0


def test_learned_bins_do_not_depend_on_the_order_or_the_shards() -> None:
    batches = _batches()
    spec = histogram(num_bins=NUM_BINS)
    whole = statistics(Scaled(), batches, [-1], stats=[spec], progress=False)[-1]
    backwards = statistics(Scaled(), batches[::-1], [-1], stats=[spec], progress=False)[-1]
    parts = []
    for chunk in (batches[4:], batches[:1], batches[1:4]):
        sink = StatisticsSink([-1], [spec])
        run_dataset(Scaled(), chunk, [-1], sink, progress=False)
        parts.append(sink)
    parts[0].merge(parts[1])
    parts[0].merge(parts[2])
    merged = parts[0].finish()[-1]
    for other in (backwards, merged):
        for name in ("histogram", "histogram_edges", "below", "above"):
            assert torch.equal(other.values[name], whole.values[name]), name


def test_infinities_go_below_and_above_nan_nowhere_and_a_feature_without_finite_values_has_nan_edges() -> None:
    counts = LearnedHistogramCounts(4, 3)
    inf, nan = float("inf"), float("nan")
    counts.add(torch.tensor([[1.0, -inf, nan], [inf, -inf, nan], [-inf, nan, nan], [2.5, inf, nan]],
                            dtype=torch.float64))
    assert counts.below.tolist() == [1, 2, 0] and counts.above.tolist() == [1, 1, 0]
    assert counts.counts.sum(dim=1).tolist() == [2, 0, 0]
    edges = counts.edges()
    assert torch.isnan(edges[1:]).all() and not torch.isnan(edges[0]).any()
    assert np.histogram([1.0, 2.5], bins=edges[0].numpy())[0].tolist() == counts.counts[0].tolist()


def test_a_constant_feature_and_values_far_from_zero() -> None:
    counts = LearnedHistogramCounts(8, 2)
    counts.add(torch.tensor([[0.0, 1e8 + 0.25], [0.0, 1e8 + 0.5]], dtype=torch.float64))
    counts.add(torch.tensor([[0.0, 1e8 + 1.75]], dtype=torch.float64))
    assert counts.counts[0].sum() == 3 and counts.counts[1].sum() == 3
    edges = counts.edges()
    assert edges[1, 0] <= 1e8 + 0.25 and 1e8 + 1.75 < edges[1, -1]
    expected, _ = np.histogram([1e8 + 0.25, 1e8 + 0.5, 1e8 + 1.75], bins=edges[1].numpy())
    assert expected.tolist() == counts.counts[1].tolist()


@pytest.mark.parametrize("arguments", [{"low": 0.0}, {"high": 1.0}, {"num_bins": 1}])
def test_half_a_range_or_one_learned_bin_is_refused(arguments: dict) -> None:
    with pytest.raises(InvalidOptionError, match="histogram"):
        histogram(**arguments)
