"""Benchmark of torchlog.extract: samples/s against a plain no_grad loop writing the same tensors.

Run `.venv/bin/python bench/extract_bench.py` (`--quick` for a smoke run of a few seconds).
Everything runs in this one process, with one torch thread by default (a torchrun rank's
setting), so the figures are per process. Two cases:

1. GPT-2 (transformers, 6 layers, hidden 256, sequence 128, batches of 8) saving two
   layers named by label (the outputs of blocks 1 and 4): extract's lean capture.
2. A CNN (a ResNet with 2 basic-width bottleneck blocks per stage, 64x64 images, batches
   of 32) saving three module outputs (`layer1`, `layer2`, `layer3`): forward hooks.

For each, samples/s of:
- plain: a `torch.no_grad()` loop over the same batches, forward hooks copying the same
  tensors, written with plain h5py into datasets allocated up front (contiguous);
- extract: `torchlog.extract` over the same batches, everything included (the first
  batch's logged probe, the per-batch check, flushing after every batch for resume);
- full path: what extract did before the fast path, two logged passes per batch
  (`log_forward_pass` with `layers_to_save`), measured once.
Target: extract at least 80% of plain. Runs alternate plain and extract so that drift in
machine load hits both; the medians are reported. The arrays of both are compared.

Then the CNN's write rate for each layout extract offers (contiguous, the default when the
size is known; chunks of whole batches; gzip; lzf): MB/s of time spent writing (inside the appender, flush
included) and file size.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter, process_time
from typing import Any

import h5py
import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import ResNet, gpt2_small  # noqa: E402  (bench/ is not a package)

import torchlog  # noqa: E402
import torchlog.storage  # noqa: E402
from torchlog.storage.arrays import Appender  # noqa: E402

MB = 1 << 20
TARGET = 0.80
# wall: time.perf_counter; cpu: this process's CPU time, steadier on a machine others share.
CLOCKS = {"wall": perf_counter, "cpu": process_time}
clock = perf_counter


@dataclass(frozen=True)
class ExtractCase:
    """A model, its samples, and the layers to save: as extract entries and as modules to hook."""

    name: str
    build: Callable[[], nn.Module]
    samples: Callable[[], torch.Tensor]
    batch_size: int
    modules: tuple[str, ...]  # whose outputs are saved (the plain loop hooks them)
    by_label: bool  # name them to extract by label (lean capture), else by address (hooks)


def cases(quick: bool) -> list[ExtractCase]:
    """The two cases, small with `quick`."""
    tokens = lambda n, length: torch.randint(0, 1000, (n, length), generator=torch.Generator().manual_seed(0))
    images = lambda n, size: torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(0))
    if quick:
        return [ExtractCase("GPT-2 (2 layers, seq 16)", lambda: gpt2_small(2, 64, 2), lambda: tokens(16, 16),
                            4, ("transformer.h.0", "transformer.h.1"), True),
                ExtractCase("CNN (1 block/stage, 32x32)", lambda: ResNet((1, 1, 1, 1), 10, 16).eval(),
                            lambda: images(32, 32), 8, ("layer1", "layer2", "layer3"), False)]
    return [ExtractCase("GPT-2 (6 layers, hidden 256, seq 128)", gpt2_small, lambda: tokens(96, 128), 8,
                        ("transformer.h.1", "transformer.h.4"), True),
            ExtractCase("CNN (ResNet 2 blocks/stage, 64x64)", lambda: ResNet((2, 2, 2, 2), 10, 32).eval(),
                        lambda: images(512, 64), 32, ("layer1", "layer2", "layer3"), False)]


def entries_for(case: ExtractCase, model: nn.Module, samples: torch.Tensor) -> list[str]:
    """The extract entries: module addresses, or the labels of those modules' outputs."""
    if not case.by_label:
        return list(case.modules)
    probe = torchlog.log_forward_pass(model, samples[:1], layers_to_save=None)
    return [probe.modules[address].call_outputs[0][0] for address in case.modules]


def _first_tensor(output: Any) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output[0]


def plain_loop(model: nn.Module, samples: torch.Tensor, case: ExtractCase, path: Path) -> float:
    """Seconds for a no_grad forward loop whose hooks copy the modules' outputs, written with
    h5py into datasets allocated on the first batch."""
    copies: dict[str, torch.Tensor] = {}
    named = dict(model.named_modules())
    handles = [named[a].register_forward_hook(
        lambda m, args, out, a=a: copies.__setitem__(a, _first_tensor(out).detach().clone()))
        for a in case.modules]
    started = clock()
    try:
        with torch.no_grad(), h5py.File(path, "w") as file:
            for start in range(0, len(samples), case.batch_size):
                model(samples[start:start + case.batch_size])
                for address, tensor in copies.items():
                    if address not in file:
                        file.create_dataset(address, shape=(len(samples), *tensor.shape[1:]), dtype=np.float32)
                    file[address][start:start + len(tensor)] = tensor.numpy()
    finally:
        for handle in handles:
            handle.remove()
    return clock() - started


def run_extract(model: nn.Module, samples: torch.Tensor, case: ExtractCase, entries: list, path: Path,
                **options: Any) -> float:
    started = clock()
    torchlog.storage.extract(model, samples, entries, path, batch_size=case.batch_size, overwrite=True,
                             progress=False, **options)
    return clock() - started


def measure(case: ExtractCase, repeats: int, folder: Path) -> dict[str, Any]:
    """Samples/s of the plain loop, extract and the full path; the largest difference of values."""
    model, samples = case.build(), case.samples()
    entries = entries_for(case, model, samples)
    plain_loop(model, samples, case, folder / "warm.h5")  # warm-up: allocator, kernels, files
    plain, fast = [], []
    for _ in range(repeats):
        plain.append(plain_loop(model, samples, case, folder / "plain.h5"))
        fast.append(run_extract(model, samples, case, entries, folder / "extract.h5"))
    full = run_extract(model, samples, case, entries, folder / "full.h5", on_batch=lambda h, i: None)
    acts = torchlog.storage.open_activations(folder / "extract.h5")
    with h5py.File(folder / "plain.h5") as file:
        worst = max(float(np.abs(acts[label] - file[address][()]).max())
                    for label, address in zip(acts, case.modules))
    n = len(samples)
    return {"plain": n / statistics.median(plain), "extract": n / statistics.median(fast),
            "full": n / full, "entries": entries, "max_diff": worst}


class _WriteTimer:
    """Adds up the time (on the bench's clock) and bytes of Appender.append while active."""

    def __enter__(self) -> "_WriteTimer":
        self.seconds, self.num_bytes = 0.0, 0
        self._original, timer = Appender.append, self

        def timed(store: Appender, values: dict, num_samples: int, index: int | None = None) -> None:
            before, started = store.write_bytes, clock()
            timer._original(store, values, num_samples, index)
            timer.seconds += clock() - started
            timer.num_bytes += store.write_bytes - before

        Appender.append = timed
        return self

    def __exit__(self, *exc: object) -> None:
        Appender.append = self._original


def write_rates(case: ExtractCase, folder: Path, repeats: int) -> list[tuple[str, float, float]]:
    """(layout, MB/s writing, file MB) for each layout extract offers, on `case`; the layouts
    take turns, `repeats` times, and the median rate of each is kept."""
    model, samples = case.build(), case.samples()
    entries = entries_for(case, model, samples)
    rates: dict[str, list[float]] = {}
    sizes: dict[str, float] = {}
    for _ in range(repeats):
        for name, options in _LAYOUTS:
            path = folder / "layout.h5"
            with _WriteTimer() as timer:
                run_extract(model, samples, case, entries, path, **options)
            rates.setdefault(name, []).append(timer.num_bytes / MB / timer.seconds)
            sizes[name] = path.stat().st_size / MB
    return [(name, statistics.median(rates[name]), sizes[name]) for name, _ in _LAYOUTS]


_LAYOUTS = [("contiguous (default)", {}), ("chunks of batches", {"chunks": True}),
            ("gzip (level 4)", {"compression": "gzip"}), ("lzf", {"compression": "lzf"})]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small models, one repeat (smoke run)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs each (default 3; 1 quick)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time, or this process's CPU time (steadier on a shared machine)")
    args = parser.parse_args(argv)
    global clock
    clock = CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    repeats = args.repeats or (1 if args.quick else 3)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.clock} clock, "
          f"median of {repeats} run(s)")
    header = f"{'case':<40} {'plain/s':>9} {'extract/s':>10} {'ratio':>6} {'full/s':>8} {'ratio':>6} {'max diff':>9}"
    print(header)
    verdicts = []
    with tempfile.TemporaryDirectory() as folder:
        for case in cases(args.quick):
            r = measure(case, repeats, Path(folder))
            ratio = r["extract"] / r["plain"]
            print(f"{case.name:<40} {r['plain']:9.1f} {r['extract']:10.1f} {ratio:6.2f} {r['full']:8.1f} "
                  f"{r['full'] / r['plain']:6.2f} {r['max_diff']:9.1e}   saved {', '.join(map(str, r['entries']))}")
            verdicts.append(f"{'ok' if ratio >= TARGET else 'UNDER'}: {case.name} extract at "
                            f"{ratio:.0%} of plain (target {TARGET:.0%})")
        cnn = cases(args.quick)[1]
        print(f"\nWrite rates, {cnn.name} ({len(cnn.samples())} samples, three layers):")
        for name, rate, size in write_rates(cnn, Path(folder), repeats):
            print(f"  {name:<22} {rate:8.0f} MB/s   file {size:7.1f} MB")
    print("\nTargets:\n" + "\n".join(verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
