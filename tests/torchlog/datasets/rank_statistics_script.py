"""Models, data and statistics for the torchrun tests of test_statistics_ranks.py, which run
this module under `torchrun --nproc_per_node=2` (gloo) as
`python -m tests.torchlog.datasets.rank_statistics_script <mode> <folder>`.

Modes: `match` computes the statistics of `mlp` and `gpt2` over their data and saves each
rank's result to <folder>/<model>.rank<r>.h5, then gives each rank values of another width,
which the merge must refuse: the message goes to <folder>/mismatch.rank<r>.txt; `resume`
computes the mlp's statistics with a checkpoint (<folder>/ckpt.h5, saved after every
batch) and saves them to <folder>/mlp.rank<r>.h5, rank 1's model raising at its third call
while <folder>/fail exists; each rank writes its number of model calls to <folder>/calls.rank<r>.
"""
from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchlog.datasets import covariance, histogram, quantiles, statistics
from torchlog.errors import InvalidOptionError

ELEMENTWISE = ["mean", "var", "std", "min", "max", "abs_mean", "zeros", "nonfinite", "norm"]
MLP_SITES = ["0", "linear_2_3"]  # a module address (hooks) and a label (the lean capture)
MLP_STATS = ELEMENTWISE + [histogram(-1, 1, 5), covariance(2), quantiles((0.1, 0.5, 0.9), k=16)]
GPT2_SITES = ["h.0", "h.1.mlp"]
GPT2_STATS = ["mean", "var", "min", "max", covariance(2), histogram(num_bins=8)]  # learned bins


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 5))


def mlp_data() -> torch.Tensor:
    """70 samples: 9 batches of 8 (the last 6), so the ranks take 4 and 5 batches."""
    return torch.randn(70, 6, generator=torch.Generator().manual_seed(1))


def mlp_statistics() -> Any:
    return statistics(mlp(), mlp_data(), MLP_SITES, stats=MLP_STATS, cka=[tuple(MLP_SITES)], batch_size=8,
                      progress=False)


class Failing(nn.Module):
    """`mlp()`, raising at call number `fail_on` (1-based), counting its calls."""

    def __init__(self, fail_on: int | None) -> None:
        super().__init__()
        self.net, self.fail_on, self.calls = mlp(), fail_on, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.fail_on:
            raise RuntimeError(f"stopped at call {self.calls}")
        return self.net(x)


def resumed_statistics(folder: Path, rank: int) -> Any:
    model = Failing(3 if rank == 1 and (folder / "fail").exists() else None)
    try:
        return statistics(model, mlp_data(), ["net.0", "net.2"], stats=MLP_STATS, cka=[("net.0", "net.2")],
                          batch_size=8, progress=False, checkpoint=folder / "ckpt.h5", checkpoint_every=1)
    finally:
        (folder / f"calls.rank{rank}").write_text(str(model.calls))


def gpt2() -> nn.Module:
    import transformers

    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
                                     attn_implementation="eager")
    torch.manual_seed(2)
    return transformers.GPT2Model(config).eval()


def gpt2_data() -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    return [{"input_ids": torch.randint(0, 100, (n, 10), generator=generator)} for n in (3, 1, 4, 2, 2)]


def gpt2_statistics() -> Any:
    return statistics(gpt2(), gpt2_data(), GPT2_SITES, stats=GPT2_STATS, reduce="tokens", cka=[tuple(GPT2_SITES)],
                      progress=False)


def mismatched(rank: int) -> str:
    """The error of statistics whose ranks see values of other widths (4 + rank)."""
    batches = [torch.randn(3, 4 + rank), torch.randn(3, 4 + rank)]
    try:
        statistics(nn.Sequential(nn.ReLU()), batches, ["0"], stats=["mean"], progress=False)
    except InvalidOptionError as exc:
        return str(exc)
    return "no error"


def main(mode: str, folder: Path) -> int:
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    try:
        if mode == "match":
            mlp_statistics().save(folder / f"mlp.rank{rank}.h5")
            gpt2_statistics().save(folder / f"gpt2.rank{rank}.h5")
            (folder / f"mismatch.rank{rank}.txt").write_text(mismatched(rank))
            return 0
        resumed_statistics(folder, rank).save(folder / f"mlp.rank{rank}.h5")
        return 0
    finally:
        torch.distributed.destroy_process_group()
        # Collect the cycles now, while the interpreter is whole: left to its final collection,
        # gloo's worker threads were seen aborting the process ("terminate called without an
        # active exception") in about one run in six, after every result was written.
        gc.collect()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
