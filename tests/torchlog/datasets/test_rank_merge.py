"""What ranks exchange and merge: states packed to bytes and back unchanged, CKA pairs merged,
and states that cannot merge refused naming both sides (without torchrun: the collectives
themselves run in test_statistics_ranks.py)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from torchlog.datasets import StatisticsSink, covariance, histogram, quantiles, run_dataset, statistics
from torchlog.datasets.rank_merge import check_match, pack, unpack
from torchlog.errors import InvalidOptionError

STATS = ["mean", "var", "min", "zeros", histogram(num_bins=4), covariance(2), quantiles((0.5,), k=4)]


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 5))


def _fed(batches: list[torch.Tensor], sites=("0", "2"), stats=None, cka=(("0", "2"),)) -> StatisticsSink:
    sink = StatisticsSink(list(sites), stats or STATS, cka=list(cka))
    run_dataset(_mlp(), batches, list(sites), sink, progress=False)
    return sink


def _batches() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(n, 6, generator=generator) for n in (5, 9, 2, 11, 4, 6)]


def test_a_packed_state_comes_back_bit_for_bit() -> None:
    sink = _fed(_batches())
    meta, tensors = sink.state()
    back_meta, back = unpack(pack((meta, tensors)))
    assert back_meta == meta and list(back) == list(tensors)
    for name, value in tensors.items():
        assert back[name].dtype == value.dtype and torch.equal(back[name], value), name
    copy = sink.blank()
    copy.load_state(back_meta, back)
    first, second = sink.finish(), copy.finish()
    for site in first:
        for name in first[site].names:
            assert torch.equal(first[site].values[name], second[site].values[name]), (site, name)
    assert first.cka == second.cka


def test_cka_and_every_state_merge_in_any_order_to_the_whole() -> None:
    batches = _batches()
    whole = _fed(batches).finish()
    parts = [_fed(batches[4:]), _fed(batches[:1]), _fed(batches[1:4])]
    merged = parts[0].blank()
    for part in parts:
        merged.merge(part)
    result = merged.finish()
    assert result.cka[("0", "2")] == pytest.approx(whole.cka[("0", "2")], rel=1e-10)
    for site in ("0", "2"):
        for name in ("mean", "var", "covariance", "components"):
            torch.testing.assert_close(result[site].values[name], whole[site].values[name], rtol=1e-10, atol=1e-12)
        for name in ("min", "zeros", "histogram", "histogram_edges", "below", "above"):
            assert torch.equal(result[site].values[name], whole[site].values[name]), name


def test_states_of_other_sites_or_widths_are_refused_naming_both() -> None:
    batches = _batches()
    with pytest.raises(InvalidOptionError, match=r"cannot merge statistics of \{'sites': \[\"'0'\"\].*into statistics "
                                                 r"of \{'sites': \[\"'0'\", \"'2'\"\]"):
        _fed(batches).merge(_fed(batches, sites=("0",), cka=()))
    states = []
    for width in (4, 6):  # rank 0 saw values 4 wide, rank 1 values 6 wide
        sink = StatisticsSink(["0"], ["mean"])
        run_dataset(nn.Sequential(nn.Identity()), [b[:, :width] for b in batches], ["0"], sink, progress=False)
        states.append(sink.state())
    with pytest.raises(InvalidOptionError, match=r"site '0' has values of other shapes on ranks 0 and 1: rank 0 kept "
                                                 r"dimensions \[1\] of sizes \[4\].*rank 1 kept \[1\] of sizes \[6\]"):
        check_match(states)
    other_stats = _fed(batches, sites=("0",), stats=["var"], cka=()).state()
    with pytest.raises(InvalidOptionError, match=r"ranks 0 and 1 computed statistics of other stats: rank 0 has "
                                                 r"\['mean'\], rank 1 has \['var'\]"):
        check_match([states[1], other_stats])


def test_a_covariance_of_a_100k_wide_site_is_refused_with_the_memory_it_needs() -> None:
    with pytest.raises(InvalidOptionError, match=r"the covariance of site '0' over 100000 features would keep "
                                                 r"74.51 GiB of float64 state, above max_bytes=1073741824"):
        statistics(nn.Sequential(nn.ReLU()), torch.zeros(2, 100_000), ["0"], stats=[covariance()], progress=False)
