"""Benchmark of torchlog.extract: samples/s against a plain no_grad loop writing the same tensors.

Run `.venv/bin/python bench/extract_bench.py` (`--quick` for a smoke run of a few seconds;
`--save` also writes the output to bench/results/, named by what it measures, the commit
and the machine). Everything runs in this one process, with one torch thread by default
(a torchrun rank's setting), so the figures are per process. Three cases:

1. GPT-2 (transformers, 6 layers, hidden 256, sequence 128, batches of 8) saving two
   layers named by label (the outputs of blocks 1 and 4): extract's lean capture.
2. A CNN (a ResNet with 2 basic-width bottleneck blocks per stage, 64x64 images, batches
   of 32) saving three module outputs (`layer1`, `layer2`, `layer3`): forward hooks.
3. An MLP of 8 blocks (Linear 256 + GELU), 2,048 samples in batches of 64, saving two
   module outputs: little compute per batch, so extract's cost per batch shows.

For each, samples/s of:
- plain: a `torch.no_grad()` loop over the same batches, forward hooks copying the same
  tensors, written with plain h5py (`file[name][rows] = array`) into datasets allocated on
  the first batch (contiguous);
- extract: `torchlog.extract` over the same batches, everything included (the first
  batch's logged pass, the per-batch check, flushing after every batch for resume);
- with summaries: extract with TensorBoard summaries of every batch (`tensorboard=`, a
  TensorBoardSink fed the values extracted), measured once.
Runs alternate plain and extract so that drift in machine load hits both; the ratio is
given from the medians and from the fastest runs. Targets: 80% of plain for GPT-2 and the
CNN, 85% for the MLP. The arrays of both are compared.

Then, on the MLP, what each loop spends per batch beyond the bare forward passes (their
time less a loop of forward passes alone, over the batches; what comes once per run
included), with a third loop: the plain loop holding its h5py datasets instead of
looking each up by name for every write, a more careful baseline than the one the
targets are set against.

Then the CNN's write rate for each layout extract offers (contiguous, the default when the
size is known; chunks of whole batches; gzip; lzf): MB/s of time spent writing (inside the
appender, flush included) and file size.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
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
from provenance import cpu_model, provenance, provenance_line  # noqa: E402

import torchlog  # noqa: E402
import torchlog.storage  # noqa: E402
from torchlog.datasets import TensorBoardSink, extraction  # noqa: E402
from torchlog.storage.arrays import Appender  # noqa: E402

MB = 1 << 20
RESULTS = Path(__file__).resolve().parent / "results"
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
    target: float = 0.80  # extract's samples/s over plain's, at least
    per_batch: bool = False  # also show what each loop spends per batch beyond the forward


class BlockMLP(nn.Sequential):
    """`depth` blocks of Linear(width, width) -> GELU: a few small ops per batch."""

    def __init__(self, depth: int = 8, width: int = 256) -> None:
        torch.manual_seed(0)
        super().__init__(*[nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth)])


def cases(quick: bool) -> list[ExtractCase]:
    """The three cases, small with `quick`."""
    tokens = lambda n, length: torch.randint(0, 1000, (n, length), generator=torch.Generator().manual_seed(0))
    images = lambda n, size: torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(0))
    vectors = lambda n, width: torch.randn(n, width, generator=torch.Generator().manual_seed(0))
    if quick:
        return [ExtractCase("GPT-2 (2 layers, seq 16)", lambda: gpt2_small(2, 64, 2), lambda: tokens(16, 16),
                            4, ("transformer.h.0", "transformer.h.1"), True),
                ExtractCase("CNN (1 block/stage, 32x32)", lambda: ResNet((1, 1, 1, 1), 10, 16).eval(),
                            lambda: images(32, 32), 8, ("layer1", "layer2", "layer3"), False),
                ExtractCase("MLP (8 blocks, width 64, 256 samples)", lambda: BlockMLP(8, 64),
                            lambda: vectors(256, 64), 16, ("2", "5"), False, 0.85, True)]
    return [ExtractCase("GPT-2 (6 layers, hidden 256, seq 128)", gpt2_small, lambda: tokens(96, 128), 8,
                        ("transformer.h.1", "transformer.h.4"), True),
            ExtractCase("CNN (ResNet 2 blocks/stage, 64x64)", lambda: ResNet((2, 2, 2, 2), 10, 32).eval(),
                        lambda: images(512, 64), 32, ("layer1", "layer2", "layer3"), False),
            ExtractCase("MLP (8 blocks of Linear 256 + GELU)", BlockMLP, lambda: vectors(2048, 256), 64,
                        ("2", "5"), False, 0.85, True)]


def entries_for(case: ExtractCase, model: nn.Module, samples: torch.Tensor) -> list[str]:
    """The extract entries: module addresses, or the labels of those modules' outputs."""
    if not case.by_label:
        return list(case.modules)
    probe = torchlog.log_forward_pass(model, samples[:1], layers_to_save=None)
    return [probe.modules[address].call_outputs[0][0] for address in case.modules]


def _first_tensor(output: Any) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output[0]


def plain_loop(model: nn.Module, samples: torch.Tensor, case: ExtractCase, path: Path,
               keep_datasets: bool = False) -> float:
    """Seconds for a no_grad forward loop whose hooks copy the modules' outputs, written with
    h5py into datasets allocated on the first batch: looked up by name for each write
    (`file[name][rows] = array`), or with `keep_datasets` held from their creation on."""
    copies: dict[str, torch.Tensor] = {}
    named = dict(model.named_modules())
    handles = [named[a].register_forward_hook(
        lambda m, args, out, a=a: copies.__setitem__(a, _first_tensor(out).detach().clone()))
        for a in case.modules]
    kept: dict[str, h5py.Dataset] = {}
    started = clock()
    try:
        with torch.no_grad(), h5py.File(path, "w") as file:
            for start in range(0, len(samples), case.batch_size):
                model(samples[start:start + case.batch_size])
                for address, tensor in copies.items():
                    if address not in (kept if keep_datasets else file):
                        kept[address] = file.create_dataset(
                            address, shape=(len(samples), *tensor.shape[1:]), dtype=np.float32)
                    dataset = kept[address] if keep_datasets else file[address]
                    dataset[start:start + len(tensor)] = tensor.numpy()
    finally:
        for handle in handles:
            handle.remove()
    return clock() - started


def run_extract(model: nn.Module, samples: torch.Tensor, case: ExtractCase, entries: list, path: Path,
                **options: Any) -> float:
    started = clock()
    extraction.extract(model, samples, entries, path, batch_size=case.batch_size, overwrite=True,
                       progress=False, **options)
    return clock() - started


def alternate(case: ExtractCase, model: nn.Module, samples: torch.Tensor, entries: list, repeats: int,
              folder: Path) -> tuple[list[float], list[float]]:
    """Seconds of `repeats` plain loops and extracts, taking turns."""
    plain, fast = [], []
    for _ in range(repeats):
        plain.append(plain_loop(model, samples, case, folder / "plain.h5"))
        fast.append(run_extract(model, samples, case, entries, folder / "extract.h5"))
    return plain, fast


def measure(case: ExtractCase, repeats: int, folder: Path) -> dict[str, Any]:
    """Samples/s of the plain loop, extract and extract with summaries; the ratios from the medians
    and from the fastest runs; the largest difference of values."""
    model, samples = case.build(), case.samples()
    entries = entries_for(case, model, samples)
    plain_loop(model, samples, case, folder / "warm.h5")  # warm-up: allocator, kernels, files
    plain, fast = alternate(case, model, samples, entries, repeats, folder)
    board = TensorBoardSink(str(folder / "tb"))
    full = run_extract(model, samples, case, entries, folder / "full.h5", summaries=board)
    board.finish()
    acts = torchlog.storage.open_activations(folder / "extract.h5")
    with h5py.File(folder / "plain.h5") as file:
        worst = max(float(np.abs(acts[label] - file[address][()]).max())
                    for label, address in zip(acts, case.modules))
    n = len(samples)
    return {"plain": n / statistics.median(plain), "extract": n / statistics.median(fast),
            "ratio": statistics.median(plain) / statistics.median(fast),
            "ratio_min": min(plain) / min(fast), "full": n / full, "entries": entries, "max_diff": worst}


def forward_loop(model: nn.Module, samples: torch.Tensor, case: ExtractCase, path: Path) -> float:
    """Seconds for the bare no_grad forward passes over the batches: no hooks, no file."""
    started = clock()
    with torch.no_grad():
        for start in range(0, len(samples), case.batch_size):
            model(samples[start:start + case.batch_size])
    return clock() - started


def per_batch_costs(case: ExtractCase, repeats: int, folder: Path) -> dict[str, float]:
    """Microseconds each loop spends per batch beyond the bare forward passes: (its time -
    the forward loop's) / batches, what comes once per run included (file creation,
    extract's logged first batch, reopening the file); also the forward pass's own time
    per batch, and extract's samples/s over the plain loop holding its datasets. All loops
    take turns, `repeats` times; from the fastest run of each, since load only adds time."""
    model, samples = case.build(), case.samples()
    entries = entries_for(case, model, samples)
    loops = {"forward": lambda p: forward_loop(model, samples, case, p),
             "plain": lambda p: plain_loop(model, samples, case, p),
             "kept": lambda p: plain_loop(model, samples, case, p, keep_datasets=True),
             "extract": lambda p: run_extract(model, samples, case, entries, p)}
    times: dict[str, list[float]] = {}
    for _ in range(repeats):
        for name, loop in loops.items():
            times.setdefault(name, []).append(loop(folder / f"{name}.h5"))
    batches = -(-len(samples) // case.batch_size)
    costs = {name: (min(times[name]) - min(times["forward"])) / batches * 1e6 for name in loops if name != "forward"}
    costs["forward"] = min(times["forward"]) / batches * 1e6  # the forward pass itself
    costs["ratio_kept"] = min(times["kept"]) / min(times["extract"])
    return costs


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


def machine() -> str:
    """'amd-epyc-2cores': the CPU model and the cores this process may use, for file names."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    model = re.sub(r"[^a-z0-9]+", "-", cpu_model().lower()).strip("-") or "unknown-cpu"
    return f"{model}-{cores}cores"


def run(args: argparse.Namespace) -> None:
    """Print every table and the verdicts."""
    repeats = args.repeats or (1 if args.quick else 5)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.clock} clock, "
          f"{repeats} alternating run(s) of each")
    print(f"{'case':<40} {'plain/s':>9} {'extract/s':>10} {'ratio':>6} {'min':>6} {'tb/s':>8} "
          f"{'ratio':>6} {'max diff':>9}")
    verdicts = []
    with tempfile.TemporaryDirectory() as folder:
        for case in cases(args.quick):
            r = measure(case, repeats, Path(folder))
            print(f"{case.name:<40} {r['plain']:9.1f} {r['extract']:10.1f} {r['ratio']:6.2f} {r['ratio_min']:6.2f} "
                  f"{r['full']:8.1f} {r['full'] / r['plain']:6.2f} {r['max_diff']:9.1e}   saved "
                  f"{', '.join(map(str, r['entries']))}")
            verdicts.append(f"{'ok' if r['ratio'] >= case.target else 'UNDER'}: {case.name} extract at "
                            f"{r['ratio']:.0%} of plain (medians; fastest runs {r['ratio_min']:.0%}; "
                            f"target {case.target:.0%})")
        for case in (c for c in cases(args.quick) if c.per_batch):
            cost = per_batch_costs(case, 3 * repeats, Path(folder))  # short runs: more of them
            print(f"\nPer batch beyond the forward pass, {case.name}, {len(case.samples()) // case.batch_size} "
                  f"batches of {case.batch_size} (fastest of {3 * repeats} runs; once-per-run costs "
                  f"included; forward passes {cost['forward']:.0f} us):")
            print(f"  plain loop {cost['plain']:.0f} us, extract {cost['extract']:.0f} us, a plain loop "
                  f"holding its h5py datasets {cost['kept']:.0f} us (extract at {cost['ratio_kept']:.0%} of "
                  "its samples/s)")
        cnn = cases(args.quick)[1]
        print(f"\nWrite rates, {cnn.name} ({len(cnn.samples())} samples, three layers):")
        for name, rate, size in write_rates(cnn, Path(folder), repeats):
            print(f"  {name:<22} {rate:8.0f} MB/s   file {size:7.1f} MB")
    print("\nTargets:\n" + "\n".join(verdicts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small models, one run each (smoke run)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs each (default 5; 1 quick)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time, or this process's CPU time (steadier on a shared machine)")
    parser.add_argument("--save", action="store_true",
                        help="also write the output to bench/results/extract-<commit>-<machine>-<clock>.txt")
    args = parser.parse_args(argv)
    global clock
    clock = CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    if not args.save:
        run(args)
        return 0
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        run(args)
    text = f"{provenance_line()}\n{output.getvalue()}"
    print(text, end="")
    commit = provenance()["commit"].replace("+", "-")
    path = RESULTS / f"extract-{commit}-{machine()}-{args.clock}{'-quick' if args.quick else ''}.txt"
    path.write_text(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
