"""torchlog/statistics.py, the one definition of each statistic: against numpy, batched equal to
one at a time, odd values, and every front end (viewer, TensorBoard, Netron) showing the same."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import torchlog.statistics as statistics
from torchlog.statistics import NUM_BINS, TensorStats, summarize, summarize_all


def _numpy_oracle(t: torch.Tensor) -> dict:
    """The same figures computed independently with numpy in float64."""
    a = t.detach().abs().numpy() if t.is_complex() else t.detach().to(torch.float64).numpy()
    a = a.reshape(-1).astype(np.float64)
    finite = a[np.isfinite(a)]
    counts, _ = np.histogram(finite, bins=NUM_BINS, range=(finite.min(), finite.max()))
    return {"numel": a.size, "num_nan": int(np.isnan(a).sum()), "num_inf": int(np.isinf(a).sum()),
            "zeros": float((a == 0).mean()), "min": finite.min(), "max": finite.max(),
            "mean": finite.mean(), "std": finite.std(), "counts": tuple(int(c) for c in counts)}


def _samples() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(7, 33, generator=g) * 3 + 1
    with_bad = base.clone()
    with_bad[0, :5] = float("nan")
    with_bad[1, :3] = float("inf")
    with_bad[2, 0] = -float("inf")
    with_bad[3, :9] = 0.0
    return [base, with_bad, base.half(), base.bfloat16(), base.double() * 1e5,
            torch.randint(-50, 50, (300,), generator=g), torch.rand(40, generator=g) > 0.3,
            torch.complex(base, base.flip(0)), torch.relu(base)]


@pytest.mark.parametrize("index", range(len(_samples())))
def test_each_statistic_matches_numpy(index):
    t = _samples()[index]
    s, oracle = summarize(t), _numpy_oracle(t)
    assert (s.numel, s.num_nan, s.num_inf) == (oracle["numel"], oracle["num_nan"], oracle["num_inf"])
    assert s.zeros == pytest.approx(oracle["zeros"], abs=1e-12)
    assert (s.min, s.max) == (oracle["min"], oracle["max"])  # exact: no arithmetic
    assert s.mean == pytest.approx(oracle["mean"], rel=1e-12, abs=1e-12)
    assert s.std == pytest.approx(oracle["std"], rel=1e-10)  # the population std (ddof=0)
    assert s.counts == oracle["counts"]


def test_histograms_are_numpys_also_for_values_on_the_edges():
    """Values in quarters land exactly on bin edges, where rounding decides the bin."""
    g = torch.Generator().manual_seed(1)
    arrays = [torch.round(torch.randn(int(n), generator=g, dtype=torch.float64) * 8) / 4
              for n in torch.randint(30, 3000, (60,), generator=g)]
    arrays += [torch.arange(0, 97, dtype=torch.float64) * 0.1, torch.linspace(-3, 5, 1000)]
    alone = [summarize(a) for a in arrays]
    together = summarize_all(arrays + [torch.ones(5)])  # the segmented path
    for a, one, many in zip(arrays, alone, together):
        assert one.counts == many.counts == _numpy_oracle(a)["counts"]


def test_the_std_is_the_population_std_not_the_unbiased_one():
    s = summarize(torch.tensor([1.0, 3.0]))
    assert s.std == 1.0 and torch.tensor([1.0, 3.0]).std().item() == pytest.approx(math.sqrt(2))


def _same(a: TensorStats, b: TensorStats) -> bool:
    """Equal but for the summation order of the mean and std (segmented sums or plain ones)."""
    exact = ("numel", "num_nan", "num_inf", "zeros", "min", "max", "counts")
    return all(getattr(a, f) == getattr(b, f) for f in exact) and \
        all(getattr(a, f) == pytest.approx(getattr(b, f), rel=1e-13, abs=1e-300) for f in ("mean", "std"))


def test_many_at_once_equal_one_at_a_time_across_group_boundaries(monkeypatch):
    samples = _samples() * 3
    alone = [summarize(t) for t in samples]
    together = summarize_all(samples)
    assert len(together) == len(alone) and all(map(_same, together, alone))
    monkeypatch.setattr(statistics, "GROUP_ELEMENTS", 500)  # many groups
    monkeypatch.setattr(statistics, "SMALL", 100)  # and the larger tensors alone
    regrouped = summarize_all(samples)
    assert all(map(_same, regrouped, alone))
    monkeypatch.setattr(statistics, "SMALL", 10**9)
    for t in samples:  # each in a group with another: the segmented path
        assert _same(summarize_all([t, t[:1]])[0], summarize(t))


def test_odd_values():
    empty = summarize(torch.empty(0))
    assert (empty.numel, empty.min, empty.std, empty.counts, empty.zeros) == (0, None, None, (), 0.0)
    nans = summarize(torch.full((4,), float("nan")))
    assert (nans.num_nan, nans.num_finite, nans.mean, nans.counts) == (4, 0, None, ())
    assert summarize(torch.tensor([5, 5, 5])).counts == (3,)  # one bin when all are equal
    one = summarize(torch.tensor([2.5]))
    assert (one.mean, one.std, one.counts) == (2.5, 0.0, (1,))
    assert summarize(torch.tensor([3 + 4j])).max == 5.0
    huge = summarize(torch.tensor([-1e308, 1e308], dtype=torch.float64))
    assert huge.mean == 0.0 and huge.std == pytest.approx(1e308) and huge.counts[0] == huge.counts[-1] == 1
    tiny = summarize(torch.tensor([1e-310, 3e-310], dtype=torch.float64))  # subnormal
    assert tiny.mean == pytest.approx(2e-310) and tiny.std == pytest.approx(1e-310)
    top = summarize(torch.arange(48.0))
    assert top.counts == (2,) * NUM_BINS and top.bin_edges()[-1] == 47.0


def test_a_value_that_is_not_a_tensor_is_named():
    with pytest.raises(TypeError, match=r"item 1 is a list: \[1, 2\]"):
        summarize_all([torch.ones(1), [1, 2]])


def test_every_front_end_shows_the_same_statistics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.torchlog.export.histories import nested
    from torchlog.export.netron_metrics import node_metrics
    from torchlog.vis.viewer.data import page_data

    history = nested()
    viewer = {p["label"]: p["stats"] for p in page_data(history, "unrolled", None)["passes"]
              if "stats" in p}
    netron: dict[str, dict] = {}
    for entry in node_metrics(history):
        netron.setdefault(entry["target"], {})[entry["name"]] = entry["value"]
    events = EventAccumulator(history.to_tensorboard(str(tmp_path)),
                              size_guidance={"histograms": 0, "scalars": 0})
    events.Reload()
    compared = 0
    for record in history:
        if record.is_output:
            continue
        expected = summarize(record.tensor_contents)
        shown = viewer[record.label]
        assert (shown["min"], shown["max"], shown["nan"], shown["inf"]) == \
            (expected.min, expected.max, expected.num_nan, expected.num_inf)
        assert shown["mean"] == pytest.approx(expected.mean, rel=1e-6, abs=1e-12)  # 7 digits
        assert shown["std"] == pytest.approx(expected.std, rel=1e-6)
        assert tuple(shown["hist"]) == expected.counts
        metrics = netron[record.label]
        assert (metrics["min"], metrics["max"]) == (expected.min, expected.max)
        assert metrics["mean"] == pytest.approx(expected.mean, rel=1e-12, abs=1e-300)  # summed in
        assert metrics["std"] == pytest.approx(expected.std, rel=1e-12)  # another order
        (mean,), (std,) = events.Scalars(f"{record.label}/mean"), events.Scalars(f"{record.label}/std")
        assert mean.value == pytest.approx(expected.mean, rel=1e-6, abs=1e-7)  # stored as float32
        assert std.value == pytest.approx(expected.std, rel=1e-6)
        (histogram,) = events.Histograms(f"{record.label}/activations")
        assert tuple(int(c) for c in histogram.histogram_value.bucket) == expected.counts
        assert histogram.histogram_value.bucket_limit[-1] == pytest.approx(expected.max)
        compared += 1
    assert compared == len(history) - 1


def test_tensor_stats_is_a_frozen_record():
    s = summarize(torch.ones(2))
    assert isinstance(s, TensorStats)
    with pytest.raises(AttributeError):
        s.mean = 2.0  # type: ignore[misc]


def test_statistics_without_histograms_are_the_same_but_the_counts():
    """histograms=False (the comparison page's statistics of b and of a - b): every other field
    as numpy's, small values together and large ones alone, a float64 input left untouched."""
    g = torch.Generator().manual_seed(2)
    large = [torch.randn(5000, generator=g), torch.randn(70, 80, generator=g, dtype=torch.float64) * 1e3]
    large[1][0, :4] = float("nan")
    samples = _samples() + large
    before = [t.clone() for t in samples]
    for t, s in zip(samples, summarize_all(samples, histograms=False)):
        oracle = _numpy_oracle(t)
        assert s.counts == ()
        assert (s.numel, s.num_nan, s.num_inf, s.min, s.max) == \
            (oracle["numel"], oracle["num_nan"], oracle["num_inf"], oracle["min"], oracle["max"])
        assert s.zeros == pytest.approx(oracle["zeros"], abs=1e-12)
        assert s.mean == pytest.approx(oracle["mean"], rel=1e-12, abs=1e-12)
        assert s.std == pytest.approx(oracle["std"], rel=1e-10)
    for t, copy in zip(samples, before):
        torch.testing.assert_close(t, copy, rtol=0, atol=0, equal_nan=True)  # read, not written


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_mask_fills_are_counted_apart_and_kept_out_of_every_statistic(dtype):
    """An additive attention mask (transformers fills with torch.finfo(dtype).min) holds
    values near the dtype's limit: its statistics are those of the other entries."""
    torch.manual_seed(0)
    scores = torch.randn(2, 16, 16).to(dtype)
    causal = torch.ones(16, 16, dtype=torch.bool).triu(1)
    masked = scores.masked_fill(causal, torch.finfo(dtype).min)
    masked[0, 0, 0] = torch.finfo(dtype).max  # the other fill, also set apart
    kept = masked.double().numpy()[(~causal.expand(2, 16, 16)).numpy()]
    kept = kept[kept != float(torch.finfo(dtype).max)]
    small_group, alone = summarize_all([masked, torch.ones(3)])[0], summarize(masked.reshape(-1).repeat(20))
    for stats, copies in ((small_group, 1), (alone, 20)):
        assert stats.num_masked == copies * (2 * int(causal.sum()) + 1) and stats.num_inf == 0
        assert stats.num_finite == copies * kept.size
        assert stats.min == kept.min() and stats.max == kept.max()
        assert stats.mean == pytest.approx(kept.mean(), abs=1e-9) and stats.std == pytest.approx(kept.std(), rel=1e-9)
        assert sum(stats.counts) == copies * kept.size
        expected, _ = np.histogram(kept, bins=NUM_BINS, range=(kept.min(), kept.max()))
        assert list(stats.counts) == [copies * c for c in expected]


def test_a_limit_of_another_dtype_is_a_value_and_a_tensor_of_fills_has_no_statistics():
    wide = torch.tensor([torch.finfo(torch.float32).min, 0.0, 1.0], dtype=torch.float64)
    stats = summarize(wide)
    assert stats.num_masked == 0 and stats.min == torch.finfo(torch.float32).min
    assert math.isfinite(stats.std) and stats.std == pytest.approx(np.std(wide.numpy()), rel=1e-12)
    only = summarize(torch.full((4,), torch.finfo(torch.float32).min))
    assert (only.num_masked, only.num_finite, only.min, only.mean, only.std) == (4, 0, None, None, None)
    assert summarize(torch.tensor([-(2 ** 31), 5], dtype=torch.int32)).num_masked == 0
