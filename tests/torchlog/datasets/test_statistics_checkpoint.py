"""`statistics(checkpoint=...)`: a run interrupted by an exception, rerun with the same path,
gives the uninterrupted run's statistics bit for bit; a checkpoint of another run is refused."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from torchlog.datasets import covariance, histogram, quantiles, statistics
from torchlog.errors import InvalidOptionError, LogFileError

pytest.importorskip("h5py")

SITES = ["net.0", "net.2"]
STATS = ["mean", "var", "min", "max", "zeros", "norm", histogram(-1, 1, 4), covariance(2), quantiles((0.5,), k=4)]


class Flaky(nn.Module):
    """An MLP whose forward raises on call number `fail_on` (1-based), counting its calls."""

    def __init__(self, fail_on: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 3))
        self.fail_on, self.calls = fail_on, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.fail_on:
            raise RuntimeError(f"stopped at call {self.calls}")
        return self.net(x)


def _batches(count: int = 10) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(7, 5, generator=generator) for _ in range(count)]


def _run(model: nn.Module, path: Path, batches: list[torch.Tensor] | None = None, **options) -> object:
    options = {"stats": STATS, "cka": [tuple(SITES)], **options}
    return statistics(model, batches if batches is not None else _batches(), SITES, progress=False,
                      checkpoint=path, checkpoint_every=2, **options)


def _interrupted(path: Path) -> None:
    """Batches 0-5 run, batch 6 raises: the checkpoint holds batches 0-5 (saved after 2, 4 and 6)."""
    with pytest.raises(RuntimeError, match="stopped at call 7"):
        _run(Flaky(fail_on=7), path)
    assert path.exists()


def test_a_rerun_skips_the_saved_batches_and_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    whole = statistics(Flaky(), _batches(), SITES, stats=STATS, cka=[tuple(SITES)], progress=False)
    path = tmp_path / "stats.ckpt.h5"
    _interrupted(path)
    resumed_model = Flaky()
    resumed = _run(resumed_model, path)
    assert resumed_model.calls == 4  # batches 6 to 9 only
    assert not path.exists()  # removed once done
    for site in SITES:
        assert resumed[site].count == whole[site].count == 70
        assert resumed[site].names == whole[site].names
        for name in whole[site].names:
            assert torch.equal(resumed[site].values[name], whole[site].values[name]), (site, name)
    assert resumed.cka == whole.cka


def test_a_checkpoint_of_another_run_is_refused_naming_what_differs(tmp_path: Path) -> None:
    path = tmp_path / "stats.ckpt.h5"
    _interrupted(path)
    with pytest.raises(InvalidOptionError, match=r"its num_batches is 10, this run's is 9; rerun with the same"):
        _run(Flaky(), path, _batches(9))
    with pytest.raises(InvalidOptionError, match=r"its stats is \['max', 'mean', .*\], this run's is \['var'\]; rerun"):
        _run(Flaky(), path, stats=["var"], cka=[])
    reduces = r"its reduce is \[\"'batch'\", \"'batch'\"\], this run's is \[\"'all'\", \"'all'\"\]"
    with pytest.raises(InvalidOptionError, match=reduces):
        _run(Flaky(), path, reduce="all")
    assert path.exists()  # kept for the right rerun
    _run(Flaky(), path)


def test_a_checkpoint_path_holding_another_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "stats.h5"
    statistics(Flaky(), _batches(2), SITES, stats=["mean"], progress=False).save(path)
    with pytest.raises(LogFileError, match="torchlog-statistics"):
        _run(Flaky(), path)


def test_each_rank_keeps_its_own_file_and_another_number_of_ranks_is_refused(tmp_path: Path) -> None:
    from torchlog.datasets import StatisticsSink
    from torchlog.datasets.checkpoint import CheckpointedSink, checkpoint_path
    from torchlog.datasets.data import Data
    from torchlog.datasets.ranks import Ranks

    assert checkpoint_path(tmp_path / "s.h5", Ranks(1, 4)) == str(tmp_path / "s.rank1.h5")
    assert checkpoint_path(tmp_path / "s.h5", Ranks()) == str(tmp_path / "s.h5")
    path = tmp_path / "stats.ckpt.h5"
    _interrupted(path)
    sink = CheckpointedSink(StatisticsSink(SITES, STATS, cka=[tuple(SITES)]), str(path), 2, Data(_batches()),
                            Ranks(0, 2))
    with pytest.raises(InvalidOptionError, match=r"its world_size is 1, this run's is 2"):
        sink.restore()
