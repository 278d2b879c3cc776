"""Statistics over a whole dataset against numpy in float64 over every value, concatenated."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import torchlog
from torchlog.datasets import StatisticsSink, covariance, histogram, keep, run_dataset, statistics

ELEMENTWISE = ["mean", "var", "std", "min", "max", "abs_mean", "zeros", "nonfinite", "norm"]


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 5))


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU(), nn.Conv2d(4, 3, 3))


def _hooked(model: nn.Module, batches: list, address: str) -> np.ndarray:
    """The outputs of module `address` over all batches, by a plain forward hook, as one float64 array."""
    seen: list[torch.Tensor] = []
    handle = model.get_submodule(address).register_forward_hook(lambda m, a, out: seen.append(out.detach().clone()))
    try:
        with torch.no_grad():
            for batch in batches:
                model(batch)
    finally:
        handle.remove()
    return torch.cat(seen).double().numpy()


def _close(found: torch.Tensor, expected: np.ndarray) -> None:
    np.testing.assert_allclose(found.numpy(), expected, rtol=1e-9, atol=1e-12)


def _check_elementwise(found: torchlog.datasets.SiteStatistics, rows: np.ndarray) -> None:
    """Every elementwise statistic against numpy over `rows` (samples x features), shaped as found."""
    shape = found.shape
    assert found.count == rows.shape[0]
    _close(found.mean, rows.mean(axis=0).reshape(shape))
    _close(found.var, rows.var(axis=0).reshape(shape))
    _close(found.std, rows.std(axis=0).reshape(shape))
    _close(found.min, rows.min(axis=0).reshape(shape))
    _close(found.max, rows.max(axis=0).reshape(shape))
    _close(found.abs_mean, np.abs(rows).mean(axis=0).reshape(shape))
    _close(found.zeros, (rows == 0).mean(axis=0).reshape(shape))
    _close(found.nonfinite, (~np.isfinite(rows)).mean(axis=0).reshape(shape))
    norms = np.linalg.norm(rows, axis=1)
    _close(found.norm, np.array([norms.mean(), np.sqrt((norms ** 2).mean())]))


def test_mlp_batch_reduce_equals_numpy_over_uneven_batches() -> None:
    model = _mlp()
    torch.manual_seed(1)
    batches = [torch.randn(n, 6) for n in (7, 1, 12, 3)]
    found = statistics(model, batches, ["0", "1", "linear_2_3"], stats=ELEMENTWISE, progress=False)
    pre = _hooked(model, batches, "0")
    _check_elementwise(found["0"], pre)
    relu = _hooked(model, batches, "1")
    _check_elementwise(found["1"], relu)
    assert 0 < float(found["1"].zeros.mean()) < 1  # dead units are counted, not all or nothing
    _check_elementwise(found["linear_2_3"], _hooked(model, batches, "2"))


def test_cnn_keeps_channels() -> None:
    model = _cnn()
    torch.manual_seed(2)
    data = torch.randn(23, 2, 9, 9)
    found = statistics(model, data, ["1", "2"], stats=ELEMENTWISE, reduce=keep(1), batch_size=5, progress=False)
    for address in ("1", "2"):
        values = _hooked(model, list(data.split(5)), address)
        rows = np.moveaxis(values, 1, -1).reshape(-1, values.shape[1])  # every position of every image
        assert found[address].shape == (values.shape[1],)
        _check_elementwise(found[address], rows)
        _close(found[address].mean, values.mean(axis=(0, 2, 3)))  # the same, read as numpy's axes


def test_histogram_per_feature_equals_numpy() -> None:
    model = _mlp()
    torch.manual_seed(3)
    data = torch.randn(200, 6) * 2
    spec = histogram(-1.5, 2.0, 7)
    found = statistics(model, data, ["0"], stats=["mean", spec], batch_size=32, progress=False)["0"]
    values = _hooked(model, list(data.split(32)), "0")
    for k in range(values.shape[1]):
        counts, edges = np.histogram(values[:, k], bins=7, range=(-1.5, 2.0))
        assert found.histogram[k].tolist() == counts.tolist()
        assert int(found.below[k]) == int((values[:, k] < -1.5).sum())
        assert int(found.above[k]) == int((values[:, k] > 2.0).sum())
    np.testing.assert_array_equal(found.histogram_edges.numpy(), edges)


def test_covariance_and_principal_directions_equal_numpy() -> None:
    model = _mlp()
    torch.manual_seed(4)
    data = torch.randn(300, 6)
    found = statistics(model, data, ["2"], stats=[covariance(3)], batch_size=41, progress=False)["2"]
    values = _hooked(model, list(data.split(41)), "2")
    cov = np.cov(values, rowvar=False, bias=True)
    np.testing.assert_allclose(found.covariance.numpy(), cov, rtol=1e-8, atol=1e-12)
    eigenvalues, eigenvectors = np.linalg.eigh(cov)
    np.testing.assert_allclose(found.explained_variance.numpy(), eigenvalues[::-1][:3], rtol=1e-8)
    for k in range(3):
        alignment = abs(float(found.components[k].numpy() @ eigenvectors[:, -1 - k]))
        assert alignment == pytest.approx(1.0, abs=1e-8)


def test_linear_cka_equals_numpy() -> None:
    model = _mlp()
    torch.manual_seed(5)
    data = torch.randn(90, 6)
    found = statistics(model, data, ["0", "2"], stats=["mean"], cka=[("0", "2")], batch_size=13, progress=False)
    x = _hooked(model, list(data.split(13)), "0")
    y = _hooked(model, list(data.split(13)), "2")
    x, y = x - x.mean(axis=0), y - y.mean(axis=0)
    expected = np.linalg.norm(y.T @ x) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y))
    assert found.cka[("0", "2")] == pytest.approx(expected, rel=1e-9)


def test_variance_is_stable_far_from_zero() -> None:
    """Values of spread 1 around 1e8 (float64): a sum of squares would lose every digit."""
    model = nn.Sequential(nn.Linear(3, 3).double())
    torch.manual_seed(6)
    data = torch.randn(400, 3, dtype=torch.float64)
    offset = torch.full((3,), 1e8, dtype=torch.float64)
    with torch.no_grad():
        model[0].bias.copy_(offset)
    found = statistics(model, data, ["0"], stats=["var"], batch_size=17, progress=False)["0"]
    values = _hooked(model, list(data.split(17)), "0")
    np.testing.assert_allclose(found.var.numpy(), values.var(axis=0), rtol=1e-7)


def test_shards_merge_to_the_whole_in_any_order() -> None:
    model = _mlp()
    torch.manual_seed(7)
    batches = [torch.randn(n, 6) for n in (5, 9, 2, 11, 4, 6)]
    stats = ELEMENTWISE + [histogram(-1, 1, 5), covariance(2)]
    whole = run_dataset(model, batches, ["0"], StatisticsSink(["0"], stats), progress=False)
    parts = []
    for chunk in (batches[:1], batches[1:4], batches[4:]):
        sink = StatisticsSink(["0"], stats)
        run_dataset(model, chunk, ["0"], sink, progress=False)
        parts.append(sink)
    merged = parts[2]
    merged.merge(parts[0])
    merged.merge(parts[1])
    result = merged.finish()["0"]
    for name in whole["0"].names:
        torch.testing.assert_close(result.values[name], whole["0"].values[name], rtol=1e-10, atol=1e-12)
    assert result.count == whole["0"].count == 37


def test_memory_does_not_grow_with_the_number_of_batches() -> None:
    model = _mlp()
    stats = ELEMENTWISE + [histogram(-1, 1, 5), covariance(2)]
    sizes = []
    for num_batches in (2, 40):
        sink = StatisticsSink(["0", "linear_2_3"], stats, cka=[("0", "linear_2_3")])
        run_dataset(model, [torch.randn(8, 6) for _ in range(num_batches)], ["0", "linear_2_3"], sink, progress=False)
        sink.finish()
        sizes.append(sink.nbytes())
    assert sizes[0] == sizes[1] > 0


def test_statistics_of_integer_values() -> None:
    class Counts(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x > 0).long().cumsum(dim=1)

    torch.manual_seed(8)
    data = torch.randn(30, 4)
    found = statistics(Counts(), data, ["cumsum", 1], stats=["mean", "max"], batch_size=7, progress=False)
    np.testing.assert_array_equal(found[1].mean.numpy(), (data > 0).double().mean(dim=0).numpy())  # booleans
    found = found["cumsum"]
    values = (data > 0).long().cumsum(dim=1).double().numpy()
    _close(found.mean, values.mean(axis=0))
    _close(found.max, values.max(axis=0))


@pytest.mark.heavy
def test_gpt2_tokens_pooled_equals_numpy() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
                                     attn_implementation="eager")
    torch.manual_seed(9)
    model = transformers.GPT2Model(config).eval()
    batches = [{"input_ids": torch.randint(0, 100, (n, 10))} for n in (3, 1, 4)]
    probe = torchlog.log_forward_pass(model, [], batches[0], layers_to_save=None)
    label = probe.modules["h.1.ln_2"].call_outputs[0][0]  # an op site, found by its label
    sites = ["h.0", "h.1.mlp", label]
    found = statistics(model, batches, sites, stats=ELEMENTWISE + [covariance(2)], reduce="tokens",
                       cka=[("h.0", "h.1.mlp")], progress=False)
    for site, address in (("h.0", "h.0"), ("h.1.mlp", "h.1.mlp"), (label, "h.1.ln_2")):
        seen: list[torch.Tensor] = []
        module = model.get_submodule(address)
        handle = module.register_forward_hook(
            lambda m, a, out: seen.append((out[0] if isinstance(out, tuple) else out).detach().clone()))
        try:
            with torch.no_grad():
                for batch in batches:
                    model(**batch)
        finally:
            handle.remove()
        rows = torch.cat([v.reshape(-1, 32) for v in seen]).double().numpy()
        _check_elementwise(found[site], rows)
        np.testing.assert_allclose(found[site].covariance.numpy(), np.cov(rows, rowvar=False, bias=True),
                                   rtol=1e-7, atol=1e-10)
    assert 0 < found.cka[("h.0", "h.1.mlp")] <= 1


@pytest.mark.parametrize("k", [8, 64])
def test_quantiles_stay_within_their_tracked_rank_error(k: int) -> None:
    model = _mlp()
    torch.manual_seed(10)
    batches = [torch.randn(n, 6) * 3 for n in (50, 333, 7, 410, 200)]
    levels = (0.0, 0.01, 0.25, 0.5, 0.9, 1.0)
    found = statistics(model, batches, ["0"], stats=[torchlog.datasets.quantiles(levels, k=k)],
                       progress=False)["0"]
    values = _hooked(model, batches, "0")
    count = values.shape[0]
    error = float(found.quantile_rank_error) * count
    assert 0 < error < count / 4  # the sketch compacted, and its bound says something
    for j, q in enumerate(levels):
        for feature in range(values.shape[1]):
            value = float(found.quantiles[j, feature])
            assert value in values[:, feature]  # a sample's own value, not an interpolation
            below = int((values[:, feature] < value).sum())
            at_most = int((values[:, feature] <= value).sum())
            assert below - error - 1 <= q * count <= at_most + error + 1, (q, feature, below, at_most, error)


def test_quantile_sketches_merge_within_the_summed_bound() -> None:
    from torchlog.datasets.quantile_sketch import QuantileSketch

    torch.manual_seed(11)
    parts = [torch.randn(n, 3, dtype=torch.float64) for n in (500, 1, 1200)]
    sketches = []
    for rows in parts:
        sketch = QuantileSketch(3, k=16)
        sketch.add(rows)
        sketches.append(sketch)
    merged = sketches[1]
    merged.merge(sketches[2])
    merged.merge(sketches[0])
    whole = torch.cat(parts).numpy()
    assert merged.count == len(whole)
    for q, value in zip((0.1, 0.5, 0.95), merged.quantiles([0.1, 0.5, 0.95])):
        for feature in range(3):
            below = int((whole[:, feature] < float(value[feature])).sum())
            at_most = int((whole[:, feature] <= float(value[feature])).sum())
            assert below - merged.rank_error - 1 <= q * len(whole) <= at_most + merged.rank_error + 1
    assert sum(t.shape[1] for t in merged.levels) < 2 * 16 * len(merged.levels)
