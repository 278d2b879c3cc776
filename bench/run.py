"""Benchmark: what logging every op costs over a plain forward pass, in time and memory.

Run `.venv/bin/python bench/run.py` (add `--quick` for a smoke run of a few seconds and
`--torchlens-python PATH` to print TorchLens's figures beside ours). For each model it
prints the plain forward time, the `log_forward_pass` time with every layer saved and
no rendering, their ratio, microseconds of overhead per op and the peak memory the log
adds over a plain forward pass, checked against the targets below.

Timing: both runs happen in this process under `torch.no_grad()` (the stricter case: a
plain forward without autograd is faster), after warm-up runs, alternating plain and
logged runs so that drift in machine load hits both; we report medians.

Memory: tracemalloc cannot see torch's C++ allocations, and sampling RSS from a thread
misses short peaks, so each measurement runs in a fresh subprocess that reads its own
RSS high-water mark from the kernel (VmHWM in /proc/self/status, the figure behind
`getrusage`'s ru_maxrss, which a forked child inherits from its parent). The `plain` child and
the `log` child do the same preparation (import the logger, warm it up on a tiny model,
build the model, run two plain forward passes), then restart the high-water mark at the
current RSS (Linux `/proc/self/clear_refs`; without it the peak of importing torch hides
everything a small model does) and run one plain forward, or log one pass and keep the
result alive. Each reports how far its RSS peaked above where it started; the difference
is the memory the log costs over a plain forward pass ('-' where /proc is missing).

TorchLens set-up (benchmark only; never in .venv, and never with torchvision or a CUDA
torch; torchlens 2.36 does not require torchvision):

    python3.11 -m venv bench/.venv-torchlens
    bench/.venv-torchlens/bin/pip install torch==2.13.0
    echo torch==2.13.0 > /tmp/pin.txt
    bench/.venv-torchlens/bin/pip install -c /tmp/pin.txt torchlens==2.36.1 transformers

bench/run.py then finds bench/.venv-torchlens/bin/python by itself.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from time import perf_counter, process_time
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import BenchCase, full_cases, quick_cases  # noqa: E402  (bench/ is not a package)

TARGET_US_PER_OP = 50.0
TARGET_RATIO = {"ResNet-50 224x224": 1.3, "GPT-2 (6 layers)": 2.0}
TARGET_BYTES_PER_OP = 2048
TARGET_SAVED_FACTOR = 1.2
NOT_INSTALLED = 3  # exit status of torchlens_side.py when torchlens cannot be imported


@dataclass(frozen=True)
class LogResult:
    """What one logged pass produced, in the logger's own count."""

    num_ops: int  # len(history): every recorded tensor, inputs and outputs included
    saved_bytes: int  # bytes of the saved activations


@dataclass
class CaseResult:
    """The figures of one model for one logger."""

    name: str
    num_ops: int
    plain_s: float
    log_s: float
    saved_bytes: int
    extra_peak_bytes: int | None  # None when memory was not measured

    @property
    def ratio(self) -> float:
        return self.log_s / self.plain_s

    @property
    def us_per_op(self) -> float:
        return (self.log_s - self.plain_s) / self.num_ops * 1e6

    @property
    def memory_budget_bytes(self) -> float:
        return TARGET_SAVED_FACTOR * self.saved_bytes + TARGET_BYTES_PER_OP * self.num_ops


Logger = Callable[[torch.nn.Module, Any], tuple[Any, LogResult]]


def log_with_torchlog(model: torch.nn.Module, inputs: Any) -> tuple[Any, LogResult]:
    """Log one pass with torchlog, every layer saved, nothing rendered."""
    import torchlog

    history = torchlog.log_forward_pass(model, inputs, layers_to_save="all")
    return history, LogResult(len(history), history.num_saved_bytes)


def _forward(model: torch.nn.Module, inputs: Any) -> Any:
    return model(*inputs) if isinstance(inputs, tuple) else model(inputs)


# 'cpu' (process_time) counts only this process's CPU seconds: steadier than wall time on
# a machine shared with other jobs, and comparable to it with --threads 1.
CLOCKS: dict[str, Callable[[], float]] = {"wall": perf_counter, "cpu": process_time}
_clock = [perf_counter]


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    clock = _clock[0]
    start = clock()
    result = fn()
    return clock() - start, result


def _median_after_warmup(times: list[float]) -> float:
    return statistics.median(times[2:])  # the first two runs are warm-up


def time_plain(case: BenchCase, repeats: int | None = None) -> float:
    """Median plain forward time of `case` in seconds."""
    model, inputs = case.build(), case.make_input()
    with torch.no_grad():
        times = [_timed(lambda: _forward(model, inputs))[0] for _ in range(2 + (repeats or case.repeats))]
    return _median_after_warmup(times)


def time_case(case: BenchCase, log: Logger, repeats: int | None = None,
              plain_s: float | None = None) -> tuple[float, float, LogResult]:
    """Median plain and logged times of `case` (seconds) and what the last log recorded.

    Plain and logged runs alternate, so that drift in machine load hits both alike;
    when `plain_s` is given (measured before the logger patched torch), only the logged
    runs are timed.
    """
    model, inputs = case.build(), case.make_input()
    plain_times, log_times = [], []
    result = None
    with torch.no_grad():
        for _ in range(2 + (repeats or case.repeats)):
            if plain_s is None:
                plain_times.append(_timed(lambda: _forward(model, inputs))[0])
            elapsed, (history, result) = _timed(lambda: log(model, inputs))
            del history  # freed outside the timed region, before the next run
            log_times.append(elapsed)
    plain = plain_s if plain_s is not None else _median_after_warmup(plain_times)
    return plain, _median_after_warmup(log_times), result


# ----- memory, one fresh subprocess per measurement --------------------------------------
_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def _status_bytes(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # the kernel reports kB
    raise RuntimeError(f"no {field!r} line in {_STATUS}")


def _rss_bytes() -> int:
    return _status_bytes("VmRSS")


def _peak_rss_bytes() -> int:
    # VmHWM, not getrusage's ru_maxrss: a child started by fork+exec from a big parent
    # inherits the parent's high-water mark in ru_maxrss, and the reset cannot lower it.
    return _status_bytes("VmHWM")


def _reset_peak_rss() -> None:
    # Importing torch peaks above anything a small model needs, and the kernel may
    # page out cold library pages afterwards; writing 5 restarts VmHWM from VmRSS.
    _CLEAR_REFS.write_text("5")


def can_measure_memory() -> bool:
    """True where the high-water mark can be restarted (Linux with /proc)."""
    return _CLEAR_REFS.exists() and _STATUS.exists()


def memory_child(case: BenchCase, log: Logger, mode: str) -> dict:
    """Body of a memory subprocess: how far RSS peaks above its start during one pass.

    Both modes prepare alike, then restart the high-water mark and run one plain
    forward (`plain`) or one logged pass whose result stays alive (`log`).
    """
    warm_model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with torch.no_grad():
        log(warm_model, torch.ones(1, 4))  # lazy imports and caches count in both modes
        model, inputs = case.build(), case.make_input()
        _forward(model, inputs)
        _forward(model, inputs)
        gc.collect()
        start = _rss_bytes()
        _reset_peak_rss()
        if mode == "plain":
            _forward(model, inputs)
            return {"growth_bytes": _peak_rss_bytes() - start}
        history, result = log(model, inputs)
        report = {"growth_bytes": _peak_rss_bytes() - start, **asdict(result)}
        del history
    return report


def measure_memory(case: BenchCase, child_argv: list[str]) -> int:
    """Extra peak RSS of a logged pass over a plain one, from two fresh subprocesses.

    Raises:
        RuntimeError: a child failed; its stderr is in the message.
    """
    growth = {}
    for mode in ("plain", "log"):
        argv = child_argv + ["--memory-child", case.name, "--mode", mode]
        done = subprocess.run(argv, capture_output=True, text=True, env=_child_env())
        if done.returncode != 0:
            raise RuntimeError(f"memory child {argv!r} failed:\n{done.stderr[-3000:]}")
        growth[mode] = json.loads(done.stdout.strip().splitlines()[-1])["growth_bytes"]
    return growth["log"] - growth["plain"]


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    return env


def measure(cases: list[BenchCase], log: Logger, child_argv: list[str] | None,
            repeats: int | None, say: Callable[[str], None], plain_first: bool = False) -> list[CaseResult]:
    """Time every case in this process; measure memory in subprocesses unless child_argv is None.

    `plain_first` times every plain forward before the first log, for loggers that leave
    torch patched (which would slow the plain runs that follow).
    """
    plain = {c.name: time_plain(c) for c in cases} if plain_first else {}  # plain runs are cheap
    results = []
    for case in cases:
        say(f"  {case.name} ...")
        plain_s, log_s, logged = time_case(case, log, repeats, plain.get(case.name))
        extra = measure_memory(case, child_argv) if child_argv is not None else None
        results.append(CaseResult(case.name, logged.num_ops, plain_s, log_s, logged.saved_bytes, extra))
    return results


# ----- TorchLens, in its own interpreter -----------------------------------------------
def run_torchlens(python: str, flags: list[str]) -> list[CaseResult] | str:
    """Run bench/torchlens_side.py with `python` and `flags`; the results, or why there are none."""
    if not Path(python).exists():
        return f"not installed ({python} does not exist; see the set-up in bench/run.py's docstring)"
    argv = [python, str(Path(__file__).with_name("torchlens_side.py"))] + flags
    done = subprocess.run(argv, capture_output=True, text=True, env=_child_env())
    last_error = (done.stderr.strip().splitlines() or ["no message"])[-1]
    if done.returncode == NOT_INSTALLED:
        return f"not installed ({last_error})"
    if done.returncode != 0:
        return f"failed ({last_error})"
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    return [CaseResult(**row) for row in rows]


# ----- report ----------------------------------------------------------------------------
def _mb(num_bytes: float | None) -> str:
    return "-" if num_bytes is None else f"{num_bytes / 2**20:.1f}"


def _row(r: CaseResult) -> list[str]:
    return [r.name, str(r.num_ops), f"{r.plain_s * 1e3:.1f}", f"{r.log_s * 1e3:.1f}",
            f"{r.ratio:.2f}", f"{r.us_per_op:.1f}", _mb(r.saved_bytes), _mb(r.extra_peak_bytes),
            _mb(r.memory_budget_bytes)]


HEADER = ["model", "ops", "plain ms", "log ms", "ratio", "us/op", "saved MB", "+peak MB", "budget MB"]


def format_table(title: str, results: list[CaseResult]) -> str:
    """A fixed-width table of `results` under `title`."""
    rows = [HEADER] + [_row(r) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = [title]
    for k, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("  ".join(cells))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def check_targets(results: list[CaseResult]) -> list[str]:
    """One line per target and model: the figure, the limit and whether it is met."""
    lines = []
    for r in results:
        checks = [("us/op", r.us_per_op, TARGET_US_PER_OP)]
        if r.name in TARGET_RATIO:
            checks.append(("ratio", r.ratio, TARGET_RATIO[r.name]))
        if r.extra_peak_bytes is not None:
            checks.append(("+peak MB", r.extra_peak_bytes / 2**20, r.memory_budget_bytes / 2**20))
        for what, value, limit in checks:
            verdict = "ok" if value <= limit else "OVER"
            lines.append(f"  {verdict:4} {r.name}: {what} {value:.2f} (target <= {limit:.2f})")
    return lines


def compare(ours: list[CaseResult], theirs: list[CaseResult]) -> list[str]:
    """How many times slower TorchLens is per op and overall, per model."""
    by_name = {r.name: r for r in theirs}
    lines = []
    for r in ours:
        t = by_name.get(r.name)
        if t is None:
            continue
        per_op = (f"overhead per op {t.us_per_op / r.us_per_op:.0f}x ours" if r.us_per_op > 0
                  else "our overhead per op is below timing noise")
        lines.append(f"  {r.name}: TorchLens log time {t.log_s / r.log_s:.1f}x ours, {per_op}")
    return lines


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small models, few repeats (smoke run)")
    parser.add_argument("--torchlens-python", metavar="PATH",
                        help="python of a venv with torchlens installed "
                             "(default: bench/.venv-torchlens/bin/python if it exists)")
    parser.add_argument("--no-torchlens", action="store_true", help="skip the TorchLens comparison")
    parser.add_argument("--repeats", type=int, help="timed runs per model (default: per model)")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time, or this process's CPU time (steadier on a busy machine)")
    parser.add_argument("--memory-child", metavar="CASE", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("plain", "log"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def cases_for(quick: bool) -> list[BenchCase]:
    return quick_cases() if quick else full_cases()


def case_named(name: str, quick: bool) -> BenchCase:
    """The case called `name`.

    Raises:
        KeyError: no case has that name; the message lists the names.
    """
    found = {c.name: c for c in cases_for(quick)}
    if name not in found:
        raise KeyError(f"no benchmark case {name!r}; cases are {sorted(found)!r}")
    return found[name]


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    configure(args)
    if args.memory_child:
        print(json.dumps(memory_child(case_named(args.memory_child, args.quick), log_with_torchlog, args.mode)))
        return 0
    child = None if args.no_memory or not can_measure_memory() else [sys.executable, __file__] + child_flags(args)
    _print_setting(args)
    ours = measure(cases_for(args.quick), log_with_torchlog, child, args.repeats,
                   lambda s: print(s, file=sys.stderr, flush=True))
    print(format_table("torchlog (log_forward_pass, all layers saved, no rendering)", ours))
    print("Targets:")
    print("\n".join(check_targets(ours)))
    _print_torchlens(args, ours)
    return 0


def _print_setting(args: argparse.Namespace) -> None:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    cpus = os.cpu_count() or 1
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.clock} clock, "
          f"{'quick run' if args.quick else 'full run'}; load average {load:.1f} on {cpus} CPUs",
          flush=True)
    if load > cpus / 2 and (args.clock == "wall" or torch.get_num_threads() > 1):
        # Intra-op threads wait for each other; when other jobs hold the CPUs, each small
        # op can wait a whole scheduler slice, and plain forward times balloon.
        print("warning: the machine is busy, so wall-clock figures with several threads are "
              "unreliable; --threads 1 --clock cpu gives steadier ones", flush=True)


def configure(args: argparse.Namespace) -> None:
    """Apply --threads and --clock to this process."""
    if args.threads:
        torch.set_num_threads(args.threads)
    _clock[0] = CLOCKS[args.clock]


def child_flags(args: argparse.Namespace) -> list[str]:
    """The flags a child process needs to measure the same cases the same way."""
    flags = ["--quick"] if args.quick else []
    flags += ["--threads", str(args.threads)] if args.threads else []
    return flags + ["--clock", args.clock]


def _print_torchlens(args: argparse.Namespace, ours: list[CaseResult]) -> None:
    if args.no_torchlens:
        print("TorchLens: skipped (--no-torchlens)")
        return
    python = args.torchlens_python or str(Path(__file__).with_name(".venv-torchlens") / "bin" / "python")
    flags = child_flags(args) + ["--no-memory"] * args.no_memory
    flags += ["--repeats", str(args.repeats)] if args.repeats else []
    theirs = run_torchlens(python, flags)
    if isinstance(theirs, str):
        print(f"TorchLens: {theirs}")
        return
    print(format_table("TorchLens (torchlens.trace, all layers saved, no rendering)", theirs))
    print("TorchLens vs torchlog:")
    print("\n".join(compare(ours, theirs)))


if __name__ == "__main__":
    sys.exit(main())
