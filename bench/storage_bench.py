"""Benchmark of torchlog.storage: streaming write rate, log-time cost, lazy-open time.

Run `.venv/bin/python bench/storage_bench.py` (`--quick` for a smaller model and log).
It prints three figures and checks them against the targets:

1. Write rate: ResNet-50's activations streamed with `log_forward_pass(save_to=...)`,
   in MB/s of time spent inside the storage sink (creating, writing and flushing each
   dataset, and recording the nodes for crash recovery), against the rate of a plain
   h5py loop writing the same arrays (`create_dataset(name, data=array)`, no flush) to
   the same disk. Target: at least 70% of the plain rate. The same loop with ~4 MiB
   chunks is shown too: why uncompressed activations are stored contiguously.
2. Log time: `log_forward_pass(model, x, save_to=path)` over `log_forward_pass(model, x)`
   with everything in memory. Target: at most 1.5x.
3. Lazy open: `torchlog.load` of a log of about 1 GB, in a fresh process: seconds, and
   bytes read from the file (from /proc/self/io; the page cache does not hide them).

Each timing is the median of several runs, alternating the runs compared so that drift
in machine load hits both. Files go to a temporary folder on the same disk as /tmp
(override with --folder). Times are wall-clock: a writer thread that overlaps the forward
pass saves wall time, not CPU time. `--threads N` sets torch's intra-op threads,
`--no-open` skips figure 3 (it writes a 1 GB file), `--json PATH` keeps the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from time import perf_counter
from typing import Any

import h5py
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import resnet50  # noqa: E402  (bench/ is not a package)
from provenance import provenance, provenance_line  # noqa: E402

import torchlog  # noqa: E402
from torchlog.storage.format import chunk_shape  # noqa: E402
from torchlog.storage.writer import LogWriter  # noqa: E402

MB = 1 << 20
WRITE_TARGET = 0.70
TIME_TARGET = 1.5


class _SinkTimer:
    """Wraps LogWriter.sink to add up the seconds spent in it and the bytes it received."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.num_bytes = 0
        self._original = LogWriter.sink

    def __enter__(self) -> "_SinkTimer":
        original, timer = self._original, self

        def timed(writer: LogWriter, *args: Any):
            # The value comes last: sink(index, value) in older writers, sink(nodes, index, value) now.
            value = args[-1]
            started = perf_counter()
            result = original(writer, *args)
            timer.seconds += perf_counter() - started
            timer.num_bytes += value.element_size() * value.numel()
            return result

        LogWriter.sink = timed
        return self

    def __exit__(self, *exc: object) -> None:
        LogWriter.sink = self._original


def _plain_write(arrays: list, path: Path, chunked: bool = False) -> float:
    started = perf_counter()
    with h5py.File(path, "w") as file:
        for i, array in enumerate(arrays):
            chunks = chunk_shape(array.shape, array.itemsize) if chunked else None
            file.create_dataset(str(i), data=array, chunks=chunks)
    return perf_counter() - started


def _stream(model: nn.Module, x: torch.Tensor, path: Path) -> tuple[float, _SinkTimer]:
    if path.exists():
        path.unlink()
    with _SinkTimer() as timer:
        started = perf_counter()
        torchlog.log_forward_pass(model, x, save_to=path, random_seed=0)
        elapsed = perf_counter() - started
    return elapsed, timer


def _in_memory(model: nn.Module, x: torch.Tensor) -> tuple[float, list]:
    started = perf_counter()
    history = torchlog.log_forward_pass(model, x, random_seed=0)
    elapsed = perf_counter() - started
    distinct = {id(p.saved): p.saved for p in history if isinstance(p.saved, torch.Tensor)}
    return elapsed, [t.numpy() for t in distinct.values()]


def measure_streaming(batch: int, size: int, repeats: int, folder: Path) -> dict[str, float]:
    """Write rates and log times for ResNet-50 on a batch of `batch` images of `size` px."""
    model = resnet50().eval()
    x = torch.rand(batch, 3, size, size)
    with torch.no_grad():
        _in_memory(model, x)  # warm-up
        _stream(model, x, folder / "warm.h5")
        plain_rates, chunked_rates, sink_rates, memory_times, stream_times = [], [], [], [], []
        for _ in range(repeats):
            mem_time, arrays = _in_memory(model, x)
            num_bytes = sum(a.nbytes for a in arrays)
            plain_rates.append(num_bytes / MB / _plain_write(arrays, folder / "plain.h5"))
            chunked_rates.append(num_bytes / MB / _plain_write(arrays, folder / "chunked.h5", True))
            del arrays
            stream_time, timer = _stream(model, x, folder / "stream.h5")
            sink_rates.append(timer.num_bytes / MB / timer.seconds)
            memory_times.append(mem_time)
            stream_times.append(stream_time)
    return {
        "saved_mb": num_bytes / MB,
        "plain_mb_s": statistics.median(plain_rates),
        "chunked_mb_s": statistics.median(chunked_rates),
        "stream_mb_s": statistics.median(sink_rates),
        "memory_s": statistics.median(memory_times),
        "stream_s": statistics.median(stream_times),
    }


_OPEN_SCRIPT = textwrap.dedent("""
    import resource, sys, time
    import torchlog
    def read_bytes():
        return int(next(l for l in open("/proc/self/io") if l.startswith("rchar")).split()[1])
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    before, started = read_bytes(), time.perf_counter()
    history = torchlog.load(sys.argv[1])
    elapsed = time.perf_counter() - started
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss
    print(elapsed, read_bytes() - before, grown * 1024, len(history))
""")


class _Wide(nn.Module):
    """`num_ops` elementwise ops on a 4 MB tensor: a log of num_ops x 4 MB."""

    def __init__(self, num_ops: int) -> None:
        super().__init__()
        self.num_ops = num_ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for step in range(self.num_ops):
            x = x * 0.5 + step if step % 2 else torch.tanh(x)
        return x


def measure_lazy_open(total_mb: int, folder: Path) -> dict[str, float]:
    """Open a log of about `total_mb` MB in a fresh process: seconds, bytes read, memory."""
    path = folder / "big.h5"
    num_ops = max(1, total_mb // 4)
    with torch.no_grad():
        torchlog.log_forward_pass(_Wide(num_ops), torch.rand(MB), save_to=path, random_seed=0)
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", _OPEN_SCRIPT, str(path)], capture_output=True,
                          text=True, cwd=root, check=True)
    seconds, read, grown, num_passes = done.stdout.split()
    return {"file_mb": os.path.getsize(path) / MB, "open_s": float(seconds),
            "read_mb": int(read) / MB, "rss_growth_mb": int(grown) / MB, "passes": int(num_passes)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small images and a 100 MB log")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--folder", type=Path, default=None, help="where to write the files")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--no-open", action="store_true", help="skip the lazy-open figure (a 1 GB file)")
    parser.add_argument("--json", metavar="PATH", type=Path, help="also write the figures to PATH as JSON")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(provenance_line())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, wall clock")
    with tempfile.TemporaryDirectory(dir=args.folder) as tmp:
        folder = Path(tmp)
        size = 112 if args.quick else 224
        s = measure_streaming(args.batch, size, 3 if args.quick else args.repeats, folder)
        o = None if args.no_open else measure_lazy_open(100 if args.quick else 1024, folder)
    write_ratio = s["stream_mb_s"] / s["plain_mb_s"]
    time_ratio = s["stream_s"] / s["memory_s"]
    if args.json:
        figures = {"setting": provenance(), "threads": torch.get_num_threads(), "batch": args.batch,
                   "size": size, "streaming": s, "write_ratio": write_ratio, "save_to_ratio": time_ratio,
                   "save_to_target": TIME_TARGET, "lazy_open": o}
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    print(f"ResNet-50, batch {args.batch} at {size}x{size}: {s['saved_mb']:.0f} MB of activations")
    print(f"  write rate: streamed {s['stream_mb_s']:.0f} MB/s, plain h5py {s['plain_mb_s']:.0f} MB/s "
          f"-> {write_ratio:.0%} (target >= {WRITE_TARGET:.0%}) {'ok' if write_ratio >= WRITE_TARGET else 'MISSED'}")
    print(f"  (plain h5py with ~4 MiB chunks, the layout used with compression: {s['chunked_mb_s']:.0f} MB/s)")
    print(f"  log time: in memory {s['memory_s']:.3f}s, streamed {s['stream_s']:.3f}s -> "
          f"{time_ratio:.2f}x (target <= {TIME_TARGET}x) {'ok' if time_ratio <= TIME_TARGET else 'MISSED'}")
    if o is not None:
        print(f"lazy open of a {o['file_mb']:.0f} MB log ({o['passes']} passes): {o['open_s']:.3f}s, "
              f"{o['read_mb']:.2f} MB read, {o['rss_growth_mb']:.0f} MB more memory")
    return 0


if __name__ == "__main__":
    sys.exit(main())
