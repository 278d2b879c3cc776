"""`statistics` under `torchrun --nproc_per_node=2` (gloo on CPU): the data shared among the
ranks, the states merged on every rank, equal to one process up to float rounding, and each
rank resuming from its own checkpoint after one of them failed."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.torchlog.datasets import rank_statistics_script as script
from torchlog.datasets import Statistics

ROOT = Path(__file__).resolve().parents[3]
EXACT = ("min", "max", "zeros", "nonfinite", "histogram", "below", "above", "histogram_edges")


def _torchrun(mode: str, folder: Path) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            "-m", "tests.torchlog.datasets.rank_statistics_script", mode, str(folder)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _single(make) -> Statistics:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return make()
    finally:
        torch.set_num_threads(threads)


def _assert_ranks_agree_and_match(folder: Path, name: str, single: Statistics) -> None:
    ranks = [Statistics.load(folder / f"{name}.rank{r}.h5") for r in (0, 1)]
    assert list(ranks[0]) == list(ranks[1]) == [str(s) for s in single]
    for site in single:
        first, second, expected = ranks[0][str(site)], ranks[1][str(site)], single[site]
        assert first.count == second.count == expected.count
        assert first.names == second.names == expected.names
        for stat in expected.names:
            assert torch.equal(first.values[stat], second.values[stat]), (site, stat)  # bit for bit
            if stat in EXACT:
                assert torch.equal(first.values[stat], expected.values[stat]), (site, stat)
            elif stat not in ("quantiles", "quantile_rank_error"):
                torch.testing.assert_close(first.values[stat], expected.values[stat], rtol=1e-9, atol=1e-12)
    for pair, value in single.cka.items():
        assert ranks[0].cka[pair] == ranks[1].cka[pair] == pytest.approx(value, rel=1e-9)


def _assert_quantiles_within_bound(found, values: np.ndarray) -> None:
    """Each quantile's true rank among every value lies within its stated rank error."""
    error = float(found.quantile_rank_error) * len(values) + 1
    for j, q in enumerate(found.quantile_levels.tolist()):
        for feature in range(values.shape[1]):
            value = float(found.quantiles[j, feature])
            below, at_most = (values[:, feature] < value).sum(), (values[:, feature] <= value).sum()
            assert below - error <= q * len(values) <= at_most + error, (q, feature)


@pytest.mark.heavy
def test_two_ranks_merge_to_the_single_process_statistics_and_refuse_values_of_other_widths(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    done = _torchrun("match", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    _assert_ranks_agree_and_match(tmp_path, "mlp", _single(script.mlp_statistics))
    _assert_ranks_agree_and_match(tmp_path, "gpt2", _single(script.gpt2_statistics))
    model = script.mlp()
    with torch.no_grad():
        values = model[0](script.mlp_data()).double().numpy()
    _assert_quantiles_within_bound(Statistics.load(tmp_path / "mlp.rank0.h5")["0"], values)
    for rank in (0, 1):  # values of other widths on the two ranks: refused on both, naming both
        assert (tmp_path / f"mismatch.rank{rank}.txt").read_text().startswith(
            "site '0' has values of other shapes on ranks 0 and 1: rank 0 kept dimensions [1] of sizes [4] of 2-d "
            "values, rank 1 kept [1] of sizes [5] of 2-d values")


def test_ranks_resume_from_their_own_checkpoints_after_one_failed(tmp_path: Path) -> None:
    (tmp_path / "fail").touch()
    failed = _torchrun("resume", tmp_path)
    assert failed.returncode != 0 and "stopped at call 3" in failed.stderr, failed.stderr[-3000:]
    assert (tmp_path / "ckpt.rank1.h5").exists()  # rank 1 saved its first two batches
    (tmp_path / "fail").unlink()
    done = _torchrun("resume", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "calls.rank1").read_text() == "3"  # batches 6-8 of its 4-8
    assert int((tmp_path / "calls.rank0").read_text()) <= 4
    assert not list(tmp_path.glob("ckpt*"))  # removed once done
    renamed = {"net.0": "0", "net.2": "linear_2_3"}
    single = _single(script.mlp_statistics)
    ranks = [Statistics.load(tmp_path / f"mlp.rank{rank}.h5") for rank in (0, 1)]
    for site in renamed:
        for stat in ranks[0][site].names:
            assert torch.equal(ranks[0][site].values[stat], ranks[1][site].values[stat]), (site, stat)
    for found in ranks:
        for site, name in renamed.items():
            assert found[site].count == single[name].count == 70
            for stat in single[name].names:
                if stat in EXACT:
                    assert torch.equal(found[site].values[stat], single[name].values[stat]), (site, stat)
                elif stat not in ("quantiles", "quantile_rank_error"):
                    torch.testing.assert_close(found[site].values[stat], single[name].values[stat], rtol=1e-9,
                                               atol=1e-12)
        assert found.cka[("net.0", "net.2")] == pytest.approx(single.cka[("0", "linear_2_3")], rel=1e-9)
