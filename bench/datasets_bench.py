"""Statistics over a dataset against a hand-written hook loop, and peak memory against the dataset's length.

Run: .venv/bin/python bench/datasets_bench.py [--batches N] [--rounds R] [--out PATH]

GPT-2 (6 layers, hidden 256, 8 x 64 tokens a batch; bench/models.py), one thread, random
token batches made as they are read (so the data itself holds no memory).
- Throughput: `torchlog.datasets.statistics(model, batches, ['transformer.h.3'],
  stats=['mean', 'var'], reduce='tokens')` against a plain `no_grad` loop with one forward
  hook on that block accumulating the same count, mean and variance by hand (float64 sums
  of values and squares), over the same N batches; round-robin, median process CPU time
  (bench/round_robin.py). The row reads the loop's time over statistics' time: the
  fraction of the hand loop's throughput statistics reach (bar: >= 0.90). Beside it, the
  default statistics (every elementwise one), a label site (run under the lean capture),
  mean and var with a checkpoint saved every 5 batches (statistics(checkpoint=): an HDF5
  file of the state, rewritten whole), and a histogram with learned bins.
- Memory: in fresh processes, statistics over N and over 10 N batches, each after a
  one-batch warm-up; the peak resident set above the warm-up's (ru_maxrss), and the ratio
  of the two (bar: <= 1.10 plus 4 MiB of slack: independent of the number of batches).
  A control row does the same with a run_dataset sink that keeps every value, to show that
  the measure sees memory that grows with the batches.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torchlog  # noqa: E402
from round_robin import bench_models, measure, report  # noqa: E402
from provenance import cpu_model, provenance, provenance_line  # noqa: E402

SITE = "transformer.h.3"
BATCH, TOKENS, VOCAB = 8, 64, 1000


def batches(count: int) -> Iterator[torch.Tensor]:
    """`count` batches of token ids, the same ones every time, made as they are read."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(count):
        yield torch.randint(0, VOCAB, (BATCH, TOKENS), generator=generator)


def hand_loop(model: torch.nn.Module, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The baseline: a `no_grad` loop with one forward hook summing values and squares in float64."""
    sums: dict[str, Any] = {"n": 0, "s": None, "ss": None}

    def hook(module: Any, args: Any, out: Any) -> None:
        rows = (out[0] if isinstance(out, tuple) else out).reshape(-1, out[0].shape[-1]).double()
        sums["n"] += rows.shape[0]
        s, ss = rows.sum(dim=0), (rows * rows).sum(dim=0)
        sums["s"] = s if sums["s"] is None else sums["s"] + s
        sums["ss"] = ss if sums["ss"] is None else sums["ss"] + ss

    handle = model.transformer.h[3].register_forward_hook(hook)
    try:
        with torch.no_grad():
            for ids in batches(count):
                model(ids)
    finally:
        handle.remove()
    mean = sums["s"] / sums["n"]
    return mean, sums["ss"] / sums["n"] - mean * mean


def _statistics(model: torch.nn.Module, count: int, site: Any = SITE, stats: Any = ("mean", "var"),
                **options: Any) -> Any:
    return torchlog.datasets.statistics(model, batches(count), [site], stats=list(stats), reduce="tokens",
                                        progress=False, **options)


def _throughput_rows(model: torch.nn.Module, count: int, rounds: int) -> list[str]:
    label = torchlog.log_forward_pass(model, next(batches(1)), layers_to_save=None)[SITE].label
    folder = tempfile.mkdtemp()
    mean, var = hand_loop(model, count)
    found = _statistics(model, count)[SITE]
    assert torch.allclose(found.mean, mean, atol=1e-9) and torch.allclose(found.var, var, rtol=1e-6, atol=1e-9)
    variants = {
        "hand-written hook loop (mean, var)": lambda: hand_loop(model, count),
        f"statistics {SITE!r} (mean, var)": lambda: _statistics(model, count),
        f"statistics {SITE!r} (DEFAULT_STATS)": lambda: _statistics(model, count,
                                                                    stats=torchlog.datasets.DEFAULT_STATS),
        f"statistics label {label!r} (mean, var)": lambda: _statistics(model, count, site=label),
        f"statistics {SITE!r} checkpoint every 5": lambda: _statistics(
            model, count, checkpoint=os.path.join(folder, "state.h5"), checkpoint_every=5),
        f"statistics {SITE!r} learned histogram": lambda: _statistics(
            model, count, stats=[torchlog.datasets.histogram(num_bins=64)]),
    }
    times = measure(variants, rounds)
    base = times["hand-written hook loop (mean, var)"]
    lines = [f"Throughput over {count} batches of {BATCH}x{TOKENS} tokens (loop time / variant time; bar >= 0.90 "
             "for the module site with mean and var)"]
    for name, seconds in times.items():
        lines.append(f"  {name:<52} {seconds * 1000 / count:8.2f} ms/batch  {base / seconds:5.2f}")
    return lines


def _child(count: int, keep: bool) -> None:
    """In a fresh process: the peak RSS statistics over `count` batches add after a one-batch
    warm-up; with `keep`, the control: a sink of run_dataset that keeps every value."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = bench_models().gpt2_small().eval()
    kept: list[torch.Tensor] = []

    def run(n: int) -> Any:
        if keep:
            return torchlog.datasets.run_dataset(model, batches(n), [SITE], lambda site, i, v: kept.append(v),
                                                 progress=False)
        return _statistics(model, n)

    run(1)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run(count)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"before_kib": before, "added_kib": after - before}))


def _added(count: int, keep: bool) -> float:
    """MiB of peak RSS the child adds over `count` batches."""
    argv = [sys.executable, __file__, "--memory-child", str(count)] + (["--keep"] if keep else [])
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["added_kib"] / 1024


def _memory_rows(count: int) -> list[str]:
    lines = [f"Peak memory above a one-batch warm-up (ru_maxrss, a fresh process each; bar: {10 * count} "
             f"batches add <= 1.10x what {count} add + 4 MiB)"]
    for name, keep in (("statistics (mean, var)", False), ("control: a sink keeping every value", True)):
        small, large = _added(count, keep), _added(10 * count, keep)
        ratio = (large + 1) / (small + 1)  # 1 MiB added to both: a peak of 0 above the warm-up is fine
        verdict = "within the bar" if large <= 1.10 * small + 4 else "grows with the batches"
        lines.append(f"  {name:<40} {count} batches +{small:7.1f} MiB, {10 * count} batches +{large:7.1f} MiB, "
                     f"ratio (+1 MiB each) {ratio:6.2f}: {verdict}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--memory-child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--keep", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child is not None:
        _child(args.memory_child, args.keep)
        return
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = bench_models().gpt2_small().eval()
    lines = [provenance_line(), f"datasets_bench: torchlog {provenance()['commit']}, {cpu_model()}, "
             f"{torch.get_num_threads()} thread, {args.rounds} rounds, median process CPU time",
             "GPT-2 (6 layers, hidden 256), reduce='tokens'"]
    lines += _throughput_rows(model, args.batches, args.rounds)
    lines += _memory_rows(args.batches)
    report(lines, args.out)


if __name__ == "__main__":
    main()
