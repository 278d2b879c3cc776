"""Benchmark: what logging every op costs over a plain forward pass, in time and memory.

Run `.venv/bin/python bench/run.py --threads 1 --clock cpu` (`--device cuda` on a GPU machine:
only ResNet-50 and GPT-2 with 12 layers, bench/cuda_bench.py; add `--quick` for a smoke
run of a few seconds, `--json PATH` to keep the figures, `--torchlens-python PATH` for a
TorchLens venv elsewhere). For each model it prints the plain forward time, the
`log_forward_pass` time with every layer saved and no rendering, their ratio,
microseconds of overhead per op, the number of module calls, the peak memory the log
adds over a plain forward pass and the memory held after it while the log is alive.
Then the fixed cost of one call (a single nn.Linear(8, 8) on a (2, 8) input and the
seed's 12-op SimpleRecurrent: log time minus plain time), the cost of one module call
(100 calls of a one-op module against the same 100 ops inline), TorchLens's log time
over ours per model, and every figure beside its target from issue 16. The save_to
ratio comes from bench/storage_bench.py; bench/compare.py puts two --json runs side by
side (bench/results/ keeps the figures from before issue 16's engine work).

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
"Held" is RSS after the pass, with the log still alive (the plain child drops its
output), over RSS at the start, log child minus plain child; its limit is the bytes of
the distinct storages behind the saved tensors plus 2 KB per op.

TorchLens set-up (benchmark only; never in .venv, and never with torchvision or a CUDA
torch; torchlens 2.36 does not require torchvision):

    python3.11 -m venv bench/.venv-torchlens
    bench/.venv-torchlens/bin/pip install torch==2.13.0
    echo torch==2.13.0 > /tmp/pin.txt
    bench/.venv-torchlens/bin/pip install -c /tmp/pin.txt torchlens==2.36.1 transformers

bench/run.py then finds bench/.venv-torchlens/bin/python by itself and runs TorchLens
after torchlog in the same invocation (its memory only with --torchlens-memory: two more
subprocesses per model, each tracing once).
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
from models import BenchCase, full_cases, probe_cases, quick_cases  # noqa: E402  (bench/ is not a package)
from provenance import provenance  # noqa: E402

NOT_INSTALLED = 3  # exit status of torchlens_side.py when torchlens cannot be imported


@dataclass(frozen=True)
class LogResult:
    """What one logged pass produced, in the logger's own count."""

    num_ops: int  # len(history): every recorded tensor, inputs and outputs included
    saved_bytes: int  # bytes of the saved activations, pass by pass
    stored_bytes: int | None = None  # bytes of the distinct storages behind them that the pass made
    # (None: unknown); a saved tensor that shares a parameter's or an input's storage adds nothing


@dataclass(frozen=True)
class Logger:
    """One way to log a pass: `run` is timed, `describe` reads the log outside the timed region.

    `describe` gets the log and the data pointers of the storages that existed before the
    pass (parameters, buffers, inputs), which stored bytes leave out.
    """

    name: str
    run: Callable[[torch.nn.Module, Any], Any]
    describe: Callable[[Any, set[int]], LogResult]


@dataclass
class CaseResult:
    """The figures of one model for one logger."""

    name: str
    is_op_bound: bool
    num_ops: int
    num_module_calls: int  # forward calls of every module, the root included
    plain_s: float
    log_s: float
    saved_bytes: int
    stored_bytes: int | None
    extra_peak_bytes: int | None  # None when memory was not measured
    held_bytes: int | None  # RSS kept after the pass with the log alive, over a plain pass

    @property
    def ratio(self) -> float:
        return self.log_s / self.plain_s

    @property
    def overhead_s(self) -> float:
        return self.log_s - self.plain_s

    @property
    def us_per_op(self) -> float:
        return self.overhead_s / self.num_ops * 1e6

    @property
    def held_limit_bytes(self) -> float:
        stored = self.saved_bytes if self.stored_bytes is None else self.stored_bytes
        return stored + TARGETS["held_bytes_per_op"] * self.num_ops


# Issue 16's targets (and the earlier peak-memory and GPT-2 ratio ones, kept for comparison).
TARGETS: dict[str, Any] = {
    "us_per_op": 30.0,  # op-bound models
    "us_per_call": 200.0,  # fixed cost of one log_forward_pass call
    "us_per_module_call": 10.0,
    "torchlens_factor_op_bound": 50.0,  # TorchLens log time over ours, at least
    "torchlens_factor": 10.0,
    "ratio": {"ResNet-50 224x224": 1.3, "GPT-2 (6 layers)": 2.0},
    "held_bytes_per_op": 2048,  # held after the pass <= stored bytes + this per op
    "peak_saved_factor": 1.2,  # extra peak <= this x saved bytes + 2 KB per op
    "save_to_ratio": 1.5,  # bench/storage_bench.py
}


def _distinct_storage_bytes(tensors: list[Any], existing: set[int]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            storage = t.untyped_storage()
            if storage.data_ptr() not in existing:
                seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def existing_storages(model: torch.nn.Module, inputs: Any) -> set[int]:
    """Data pointers of the model's parameters and buffers and of the input tensors."""
    tensors = [*model.parameters(), *model.buffers(), *(inputs if isinstance(inputs, tuple) else (inputs,))]
    return {t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor)}


def _torchlog_run(model: torch.nn.Module, inputs: Any) -> Any:
    import torchlog

    return torchlog.log_forward_pass(model, inputs, layers_to_save="all")


def _torchlog_describe(history: Any, existing: set[int]) -> LogResult:
    saved = [p.saved for p in history]
    return LogResult(len(history), history.num_saved_bytes, _distinct_storage_bytes(saved, existing))


TORCHLOG = Logger("torchlog", _torchlog_run, _torchlog_describe)


def _forward(model: torch.nn.Module, inputs: Any) -> Any:
    return model(*inputs) if isinstance(inputs, tuple) else model(inputs)


def count_module_calls(model: torch.nn.Module, inputs: Any) -> int:
    """Forward calls of every module (the root included) in one plain pass."""
    calls = [0]

    def count(module: torch.nn.Module, args: Any) -> None:
        calls[0] += 1

    handle = torch.nn.modules.module.register_module_forward_pre_hook(count)
    try:
        with torch.no_grad():
            _forward(model, inputs)
    finally:
        handle.remove()
    return calls[0]


# 'cpu' (process_time) counts only this process's CPU seconds: steadier than wall time on
# a machine shared with other jobs, and comparable to it with --threads 1.
CLOCKS: dict[str, Callable[[], float]] = {"wall": perf_counter, "cpu": process_time}
_clock = [perf_counter]


# A sample repeats a fast pass until it lasts this long: the gc.collect() before each
# sample leaves the CPU caches cold for ~200 us, which would swamp a 20 us forward pass.
MIN_SAMPLE_S = 0.02
MAX_BATCH = 1000


def _timed(fn: Callable[[], Any], number: int = 1) -> tuple[float, Any]:
    """Seconds per call of `fn` over `number` calls, and the last result.

    Results stay alive until the clock stops, so freeing them is not timed.
    """
    gc.collect()
    clock = _clock[0]
    kept = []
    start = clock()
    for _ in range(number):
        kept.append(fn())
    elapsed = clock() - start
    return elapsed / number, kept[-1]


def _batch_size(fn: Callable[[], Any]) -> int:
    """Calls per sample so that one sample lasts about MIN_SAMPLE_S (one warm-up call first)."""
    fn()
    once = _timed(fn)[0]
    return max(1, min(MAX_BATCH, int(MIN_SAMPLE_S / max(once, 1e-9))))


def _median_after_warmup(times: list[float]) -> float:
    return statistics.median(times[2:])  # the first two samples are warm-up


def time_plain(case: BenchCase, repeats: int | None = None) -> float:
    """Median plain forward time of `case` in seconds."""
    model, inputs = case.build(), case.make_input()
    with torch.no_grad():
        run = lambda: _forward(model, inputs)  # noqa: E731
        number = _batch_size(run)
        times = [_timed(run, number)[0] for _ in range(2 + (repeats or case.repeats))]
    return _median_after_warmup(times)


def time_case(case: BenchCase, log: Logger, repeats: int | None = None,
              plain_s: float | None = None) -> tuple[float, float, LogResult]:
    """Median plain and logged times of `case` (seconds) and what the last log recorded.

    Plain and logged samples alternate, so that drift in machine load hits both alike;
    when `plain_s` is given (measured before the logger patched torch), only the logged
    runs are timed. Only `log.run` is timed; `log.describe` reads a log afterwards.
    """
    model, inputs = case.build(), case.make_input()
    plain_times, log_times = [], []
    with torch.no_grad():
        plain_run = lambda: _forward(model, inputs)  # noqa: E731
        log_run = lambda: log.run(model, inputs)  # noqa: E731
        plain_number = _batch_size(plain_run) if plain_s is None else 0
        log_number = _batch_size(log_run)
        for k in range(2 + (repeats or case.repeats)):
            if plain_s is None:
                plain_times.append(_timed(plain_run, plain_number)[0])
            elapsed, history = _timed(log_run, log_number)
            if k == 0:
                result = log.describe(history, existing_storages(model, inputs))
            del history  # freed outside the timed region, before the next sample
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
    """Body of a memory subprocess: how far RSS peaks above its start during one pass,
    and how much more it holds after it.

    Both modes prepare alike, then restart the high-water mark and run one plain
    forward whose output is dropped (`plain`) or one logged pass whose log stays alive
    (`log`).
    """
    warm_model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with torch.no_grad():
        log.describe(log.run(warm_model, torch.ones(1, 4)), set())  # lazy imports and caches count in both
        model, inputs = case.build(), case.make_input()
        _forward(model, inputs)
        _forward(model, inputs)
        gc.collect()
        start = _rss_bytes()
        _reset_peak_rss()
        if mode == "plain":
            output = _forward(model, inputs)
            peak = _peak_rss_bytes()
            del output
            gc.collect()
            return {"growth_bytes": peak - start, "held_bytes": _rss_bytes() - start}
        history = log.run(model, inputs)
        peak = _peak_rss_bytes()
        gc.collect()
        held = _rss_bytes() - start
        report = {"growth_bytes": peak - start, "held_bytes": held, **asdict(log.describe(history, existing_storages(model, inputs)))}
        del history
    return report


def measure_memory(case: BenchCase, child_argv: list[str]) -> tuple[int, int]:
    """Extra peak RSS of a logged pass over a plain one, and extra RSS held after it.

    Raises:
        RuntimeError: a child failed; its stderr is in the message.
    """
    reports = {}
    for mode in ("plain", "log"):
        argv = child_argv + ["--memory-child", case.name, "--mode", mode]
        done = subprocess.run(argv, capture_output=True, text=True, env=_child_env())
        if done.returncode != 0:
            raise RuntimeError(f"memory child {argv!r} failed:\n{done.stderr[-3000:]}")
        reports[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    return tuple(reports["log"][k] - reports["plain"][k] for k in ("growth_bytes", "held_bytes"))


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
    calls = {c.name: count_module_calls(c.build(), c.make_input()) for c in cases}
    results = []
    for case in cases:
        say(f"  {log.name}: {case.name} ...")
        plain_s, log_s, logged = time_case(case, log, repeats, plain.get(case.name))
        extra, held = measure_memory(case, child_argv) if child_argv is not None else (None, None)
        results.append(CaseResult(case.name, case.is_op_bound, logged.num_ops, calls[case.name], plain_s,
                                  log_s, logged.saved_bytes, logged.stored_bytes, extra, held))
    return results


@dataclass(frozen=True)
class CallCosts:
    """Fixed costs: per log_forward_pass call on tiny models, per module call, and per
    submodule that is never called (µs)."""

    linear_plain_us: float
    linear_log_us: float
    seed_plain_us: float
    seed_log_us: float
    us_per_module_call: float
    us_per_uncalled_module: float

    @property
    def linear_us(self) -> float:
        return self.linear_log_us - self.linear_plain_us

    @property
    def seed_us(self) -> float:
        return self.seed_log_us - self.seed_plain_us


def measure_call_costs(quick: bool, log: Logger = TORCHLOG) -> CallCosts:
    """Time the probes of models.probe_cases in this process."""
    probes = probe_cases(quick)
    times = {role: time_case(case, log)[:2] for role, case in probes.items()}
    extra_calls = (count_module_calls(probes["modules"].build(), probes["modules"].make_input())
                   - count_module_calls(probes["inline"].build(), probes["inline"].make_input()))
    (mp, ml), (ip, il) = times["modules"], times["inline"]
    per_module = ((ml - mp) - (il - ip)) / extra_calls
    (dp, dl), (bp, bl) = times["idle"], times["bare"]
    idle = len(list(probes["idle"].build().modules())) - len(list(probes["bare"].build().modules()))
    per_uncalled = ((dl - dp) - (bl - bp)) / idle
    (lp, ll), (sp, sl) = times["linear"], times["seed"]
    return CallCosts(lp * 1e6, ll * 1e6, sp * 1e6, sl * 1e6, per_module * 1e6, per_uncalled * 1e6)


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


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small models, few repeats (smoke run)")
    parser.add_argument("--torchlens-python", metavar="PATH",
                        help="python of a venv with torchlens installed "
                             "(default: bench/.venv-torchlens/bin/python if it exists)")
    parser.add_argument("--no-torchlens", action="store_true", help="skip the TorchLens comparison")
    parser.add_argument("--torchlens-memory", action="store_true",
                        help="measure TorchLens's memory too (two more subprocesses per model)")
    parser.add_argument("--repeats", type=int, help="timed runs per model (default: per model)")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time, or this process's CPU time (steadier on a busy machine)")
    parser.add_argument("--json", metavar="PATH", type=Path, help="also write every figure to PATH as JSON")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: only ResNet-50 and GPT-2 (12 layers, hidden 768) on the GPU, "
                             "logged keeping values there and copying them to the CPU (bench/cuda_bench.py)")
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


def _setting(args: argparse.Namespace) -> dict[str, Any]:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return {**provenance(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "clock": args.clock, "run": "quick" if args.quick else "full", "load": load,
            "cpus": os.cpu_count() or 1}


def _torchlens_results(args: argparse.Namespace) -> list[CaseResult] | str:
    if args.no_torchlens:
        return "skipped (--no-torchlens)"
    python = args.torchlens_python or str(Path(__file__).with_name(".venv-torchlens") / "bin" / "python")
    flags = child_flags(args) + ["--no-memory"] * (args.no_memory or not args.torchlens_memory)
    flags += ["--repeats", str(args.repeats)] if args.repeats else []
    return run_torchlens(python, flags)


def main(argv: list[str] | None = None) -> int:
    from report import format_report, report_json  # noqa: PLC0415  (bench/ is on sys.path)

    args = _parse(argv)
    configure(args)
    if args.memory_child:
        print(json.dumps(memory_child(case_named(args.memory_child, args.quick), TORCHLOG, args.mode)))
        return 0
    setting = _setting(args)
    if args.device == "cuda":
        from cuda_bench import format_cuda, measure_cuda  # noqa: PLC0415  (bench/ is on sys.path)

        rows = measure_cuda(args.repeats or 11)
        print(format_cuda(rows))
        if args.json:
            args.json.write_text(json.dumps({"setting": setting, "cuda": rows}, indent=1) + "\n")
        return 0
    say = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    child = None if args.no_memory or not can_measure_memory() else [sys.executable, __file__] + child_flags(args)
    say("  torchlog: fixed costs per call ...")
    calls = measure_call_costs(args.quick)
    ours = measure(cases_for(args.quick), TORCHLOG, child, args.repeats, say)
    say("  TorchLens (its own interpreter) ...")
    theirs = _torchlens_results(args)
    print(format_report(setting, ours, calls, theirs))
    if args.json:
        args.json.write_text(json.dumps(report_json(setting, ours, calls, theirs), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
