"""Where each microsecond of logging goes, per op: mode, parent lookup, call site, module stack,
node creation, saving, loop grouping, assembly, history, and the fixed cost of a call.

Run: .venv/bin/python bench/breakdown.py [--quick | --all] [--json PATH] [--profile]
Default: the op-bound cases of bench/models.py; `--all` every full case (ResNet-50 and the
RNN too); `--quick` the small quick_cases, a smoke run of a few seconds.

Everything is measured in one process, one thread (torch.set_num_threads(1)), in process CPU
time (time.process_time: steadier than wall time on a shared machine), under torch.no_grad().
Each figure is the median of several runs; the variants of one model run round-robin, one run
of each per round, so that load drift hits all alike. Each timed run follows an untimed run
of the same variant: timed warm, as in a loop of calls (after another variant's run, a small
model's caches are cold: nn.Linear(8, 8) takes 50 us instead of 24). Variants and direct timings:

- plain: the model's forward.
- floor: the forward under a do-nothing TorchFunctionMode, with every submodule's forward
  wrapped as capture wraps it (torchlog.capture.boundaries) for a recorder whose enter and
  leave do nothing: the cost of the mechanism itself, before any of ours.
- no save / all saved: log_forward_pass with layers_to_save=None and with 'all'. Wrappers
  around torchlog.api._capture, torchlog.capture.run._run_recorded and torchlog.api._build
  time the capture, the forward under capture (mode, module wrappers, per-op work) and the build.
- no call site: no save with `call_site` (as torchlog.capture.recorder and
  torchlog.capture.functionals imported it) answering None.
- no call site, no module stack: also Recorder.enter/leave/leave_raised as no-ops. Call sites are
  ablated first because enter itself looks up the module's call site; this way no cost is
  counted twice, and the module-stack difference is not skewed by longer call-site walks.
- parent timer: no save with Recorder._find_parents wrapped in perf_counter_ns; the sum of
  its intervals, minus one calibrated timer overhead per call, is the parent lookup. (Timing
  the calls, not replacing them by `([], [])`, keeps the graph the same: without parents no
  child links or buffer source nodes are made, which would shift cost into other rows.) This
  is the one wall-clock figure; a preempted call inflates one run, which the median drops.
- grouping, assembly, history: group_into_layers(nodes), assemble(captured) and
  torchlog.api._build(...) timed directly on the no-save CapturedPass, captured once.
- per call: log_forward_pass (no save) of nn.Linear(8, 8) on a (2, 8) input minus its plain
  forward: the fixed cost of one call, measured once, printed apart and split into api
  (arguments, options, around the capture), capture set-up (recorder, module table, seeding,
  model state kept), mode + wrappers (its floor - plain), the forward under capture beyond that
  floor, and the build.

Categories, per op (divided by len(history)):
  mode + wrappers = floor - plain                 measured
  parent lookup = timer sum                    measured (wall clock, see above)
  call site = forward(no save) - forward(no call site)                    difference
  module stack = forward(no call site) - forward(no call site, no module stack)  difference
  node creation = forward(no call site, no module stack) - floor - parent lookup: the rest
      of the per-op path (dispatch, timing the op, the node, its producer entry)   remainder
  saving = total(all saved) - total(no save)   difference
  grouping = group_into_layers; assembly = assemble - grouping; history = _build - assemble
  set-up = the tiny model's work outside its forward and build (api + capture set-up, per
      call) / this model's ops: its forward and build are counted in this model's own rows
Each category is the median over rounds of its value in each round (a paired difference:
drift between rounds cancels). The sum of the printed categories stands next to the measured
total, the median of all saved minus plain. Node creation closes the forward by construction,
so the residual is what the tiny model's set-up misses of this model's own work outside its
forward and build (printed per call as 'own set-up': parts of it grow with the number of
modules and buffers), plus the build timed directly against the one inside the log call, plus
noise; IQR, the spread of the total between rounds, shows the noise. Module stack is also
given per submodule call (the root's call does no bookkeeping and is not counted). Node
creation also holds the per-call work inside the forward (wrapping the forwards and pushing the mode,
the output nodes): on a model of a dozen ops it is a sizeable part of that row.

`--profile` then runs cProfile over a few logged passes of each op-bound model and shows
where the time goes, in microseconds per op: per source file (torchlog's own modules
by path; torch's Python layers such as torch/overrides.py and torch/nn/modules/module.py;
the model's code; C functions, the ops themselves among them) and the functions that cost
most by their own time. cProfile inflates every Python call, so read shares, not totals.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import pstats
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from time import perf_counter, perf_counter_ns, process_time
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import BenchCase, full_cases, quick_cases  # noqa: E402
from provenance import provenance, provenance_line  # noqa: E402
from run import _forward, count_module_calls  # noqa: E402

import torchlog  # noqa: E402
import torchlog.api as api  # noqa: E402
import torchlog.capture.functionals as functionals  # noqa: E402
import torchlog.capture.recorder as recorder  # noqa: E402
import torchlog.capture.run as capture_run  # noqa: E402
from torchlog.assemble import assemble  # noqa: E402
from torchlog.capture.boundaries import module_boundaries  # noqa: E402
from torchlog.loops import group_into_layers  # noqa: E402

CATEGORIES = ("mode + wrappers", "parent lookup", "call site", "module stack", "node creation",
              "saving", "grouping", "assembly", "history", "set-up")


class _NullMode(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _NullRecorder:
    """What module_boundaries needs of a recorder, doing nothing at each module call."""

    acting_inputs = False  # no plan: module inputs reach forward as they are

    def __init__(self, model: Any) -> None:
        self.named_modules = list(model.named_modules())
        self.module_addresses = {id(m): a for a, m in self.named_modules if a}

    def enter(self, address: str, frame: Any) -> None:
        return None

    def leave(self, address: str, output: Any) -> Any:
        return output  # what the module's caller gets

    def leave_raised(self, address: str) -> None:
        return None


@contextlib.contextmanager
def _patched(changes: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Set each (owner, name, value) for the block; the originals come back however it ends."""
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in changes]
    try:
        for owner, name, value in changes:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in reversed(originals):
            setattr(owner, name, value)


class _PhaseClock:
    """Process CPU time of the capture, the forward under capture and the build of one log call."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    def patches(self) -> list[tuple[Any, str, Any]]:
        return [(api, "_capture", self._timed("capture", api._capture)),
                (capture_run, "_run_recorded", self._timed("forward", capture_run._run_recorded)),
                (api, "_build", self._timed("build", api._build))]

    def _timed(self, phase: str, fn: Callable) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = process_time()
            try:
                return fn(*args, **kwargs)
            finally:  # summed: a pass run again (stale saves) counts in full
                self.times[phase] = self.times.get(phase, 0.0) + process_time() - start
        return timed


class _ParentTimer:
    """Wall time spent in Recorder._find_parents, less the timer's own cost per call."""

    def __init__(self) -> None:
        self.ns = self.calls = 0
        self.overhead_ns = _timer_overhead_ns()

    def patches(self) -> list[tuple[Any, str, Any]]:
        find = recorder.Recorder._find_parents

        def timed(rec: Any, args: tuple, kwargs: dict) -> tuple[list, list]:
            start = perf_counter_ns()
            found = find(rec, args, kwargs)
            self.ns += perf_counter_ns() - start
            self.calls += 1
            return found
        return [(recorder.Recorder, "_find_parents", timed)]

    def take(self) -> float:
        """Seconds measured since the last take."""
        seconds = max(self.ns - self.calls * self.overhead_ns, 0) * 1e-9
        self.ns = self.calls = 0
        return seconds


def _timer_overhead_ns() -> float:
    """What one `start = perf_counter_ns(); ... perf_counter_ns() - start` adds: median of batch means."""
    means = []
    for _ in range(21):
        total = 0
        for _ in range(2000):
            start = perf_counter_ns()
            total += perf_counter_ns() - start
        means.append(total / 2000)
    return statistics.median(means)


def _no_site(stop: Any = None, stop_site: tuple | None = None, start: Any = None) -> None:
    return None


def _no_enter(self: Any, address: str, frame: Any) -> None:
    return None


def _no_leave(self: Any, address: str, output: Any) -> Any:
    return output  # what the module's caller gets


def _no_leave_raised(self: Any, address: str) -> None:
    return None


_NO_SITE = [(recorder, "call_site", _no_site), (functionals, "call_site", _no_site)]
_NO_MODULES = [(recorder.Recorder, "enter", _no_enter), (recorder.Recorder, "leave", _no_leave),
               (recorder.Recorder, "leave_raised", _no_leave_raised)]


def _timed_run(fn: Callable[[], Any], patches: list | None = None, clock: _PhaseClock | None = None,
               timer: _ParentTimer | None = None) -> dict[str, float]:
    """Seconds of one call of `fn` with `patches` applied: 'total', and the clock's phases."""
    with _patched(patches or []):
        if clock is not None:
            clock.times.clear()
        start = process_time()
        fn()
        figures = {"total": process_time() - start}
    if clock is not None:
        figures.update(clock.times)
    if timer is not None:
        figures["parents"] = timer.take()
    return figures


def _round_robin(variants: dict[str, Callable[[], dict[str, float]]],
                 repeats: int) -> list[dict[str, dict[str, float]]]:
    """Seconds per variant and figure, one dict per round; one run of each variant per round."""
    for run in variants.values():
        run()  # warm-up: caches, first-use descriptions
    rounds = []
    for _ in range(repeats):
        figures = {}
        for name, run in variants.items():
            run()  # the timed run follows one of its own, as in a loop of calls, not another variant's
            figures[name] = run()
        rounds.append(figures)
    return rounds


def _medians(per_round: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in per_round) for key in per_round[0]}


def _iqr(values: list[float]) -> float:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [0.0, 0.0, 0.0]
    return q[2] - q[0]


def _log_call(model: Any, inputs: Any, save: str | None) -> Callable[[], Any]:
    return lambda: torchlog.log_forward_pass(model, inputs, layers_to_save=save)


def _floor_call(model: Any, inputs: Any) -> Callable[[], Any]:
    """The forward under a do-nothing mode, its submodules' forwards wrapped for a do-nothing recorder."""
    def floor() -> None:
        null = _NullRecorder(model)  # the walk of the model, as each log call makes one
        with module_boundaries(null, null.named_modules), _NullMode():
            _forward(model, inputs)
    return floor


def measure_per_call(repeats: int) -> dict[str, float]:
    """Fixed cost of one call in µs (no save) on nn.Linear(8, 8), and its parts (medians of
    per-round differences)."""
    torch.manual_seed(0)
    model, inputs = torch.nn.Linear(8, 8).eval(), torch.randn(2, 8)
    clock = _PhaseClock()
    with torch.no_grad():
        rounds = _round_robin({
            "plain": lambda: _timed_run(lambda: model(inputs)),
            "floor": lambda: _timed_run(_floor_call(model, inputs)),
            "log": lambda: _timed_run(_log_call(model, inputs, None), clock.patches(), clock),
            "log all": lambda: _timed_run(_log_call(model, inputs, "all")),
        }, repeats)
    parts = []
    for r in rounds:
        plain, log = r["plain"]["total"], r["log"]
        parts.append({
            "plain": plain, "log": log["total"], "fixed": log["total"] - plain,
            "fixed all saved": r["log all"]["total"] - plain,
            "api": log["total"] - log["capture"] - log["build"], "capture set-up": log["capture"] - log["forward"],
            "forward under capture": log["forward"] - r["floor"]["total"], "mode + wrappers": r["floor"]["total"] - plain,
            "build": log["build"],
            # outside the forward and the build: what `set-up` adds per call to a model's sum
            "set-up": log["total"] - log["forward"] - log["build"]})
    return {k: v * 1e6 for k, v in _medians(parts).items()}


def _grab_captured(model: Any, inputs: Any) -> tuple[Any, Any]:
    """The request and CapturedPass of one no-save log call, taken on their way to _build."""
    grabbed = []
    build = api._build

    def keep(request: Any, captured: Any, *args: Any, **kwargs: Any) -> Any:
        grabbed.append((request, captured))
        return build(request, captured, *args, **kwargs)

    with _patched([(api, "_build", keep)]):
        torchlog.log_forward_pass(model, inputs, layers_to_save=None)
    return grabbed[-1]


def _variants(model: Any, inputs: Any, clock: _PhaseClock,
              timer: _ParentTimer) -> dict[str, Callable[[], dict[str, float]]]:
    request, captured = _grab_captured(model, inputs)
    build = api._build
    phases = clock.patches()
    nosave, saved = _log_call(model, inputs, None), _log_call(model, inputs, "all")
    return {
        "plain": lambda: _timed_run(lambda: _forward(model, inputs)),
        "floor": lambda: _timed_run(_floor_call(model, inputs)),
        "no save": lambda: _timed_run(nosave, phases, clock),
        "all saved": lambda: _timed_run(saved, phases, clock),
        "no call site": lambda: _timed_run(nosave, phases + _NO_SITE, clock),
        "no call site, no module stack": lambda: _timed_run(nosave, phases + _NO_SITE + _NO_MODULES, clock),
        "parent timer": lambda: _timed_run(nosave, timer.patches(), timer=timer),
        "grouping": lambda: _timed_run(lambda: group_into_layers(captured.nodes)),
        "assembly": lambda: _timed_run(lambda: assemble(captured)),
        "history": lambda: _timed_run(lambda: build(request, captured, perf_counter(), False)),
    }


def _categories(r: dict[str, dict[str, float]], set_up: float) -> dict[str, float]:
    """Seconds per pass of each category from one round's figures."""
    t = {name: figures["total"] for name, figures in r.items()}
    fwd = {name: figures["forward"] for name, figures in r.items() if "forward" in figures}
    parents = r["parent timer"]["parents"]
    return {
        "mode + wrappers": t["floor"] - t["plain"],
        "parent lookup": parents,
        "call site": fwd["no save"] - fwd["no call site"],
        "module stack": fwd["no call site"] - fwd["no call site, no module stack"],
        "node creation": fwd["no call site, no module stack"] - t["floor"] - parents,
        "saving": t["all saved"] - t["no save"],
        "grouping": t["grouping"],
        "assembly": t["assembly"] - t["grouping"],
        "history": t["history"] - t["assembly"],
        "set-up": set_up,
    }


def breakdown_case(case: BenchCase, repeats: int, per_call: dict[str, float]) -> dict[str, Any]:
    """The categories of one model in µs per op (medians of per-round differences, which
    cancel load drift between rounds), with the median timings (ms) they come from."""
    model, inputs = case.build(), case.make_input()
    clock, timer = _PhaseClock(), _ParentTimer()
    with torch.no_grad():
        ops = len(torchlog.log_forward_pass(model, inputs, layers_to_save=None))
        calls = count_module_calls(model, inputs) - 1  # the root's call does no bookkeeping
        rounds = _round_robin(_variants(model, inputs, clock, timer), repeats)
    per_round = [_categories(r, per_call["set-up"] * 1e-6) for r in rounds]
    for cats, r in zip(per_round, rounds):
        cats["total"] = r["all saved"]["total"] - r["plain"]["total"]
        # this model's own work outside the forward and the build: the set-up the tiny
        # model's figure stands for, plus whatever of it grows with the model
        cats["own set-up"] = r["no save"]["total"] - r["no save"]["forward"] - r["no save"]["build"]
    us = {k: v * 1e6 / ops for k, v in _medians(per_round).items()}
    us["sum"] = sum(us[c] for c in CATEGORIES)  # of the medians printed, so a reader can add them up
    module_stack = statistics.median(c["module stack"] for c in per_round)
    return {
        "name": case.name, "ops": ops, "module_calls": calls,
        "plain_ms": statistics.median(r["plain"]["total"] for r in rounds) * 1e3,
        "total_us_per_op": us["total"], "sum_us_per_op": us["sum"], "residual_us_per_op": us["total"] - us["sum"],
        "own_set_up_us_per_call": us["own set-up"] * ops,
        "us_per_op": {c: us[c] for c in CATEGORIES},
        "module_stack_us_per_call": module_stack * 1e6 / calls if calls else None,
        # spread between rounds of the measured total: the noise a category must exceed
        "noise_us_per_op": _iqr([c["total"] for c in per_round]) * 1e6 / ops,
        "medians_ms": {name: {k: v * 1e3 for k, v in _medians([r[name] for r in rounds]).items()}
                       for name in rounds[0]},
        "repeats": repeats,
    }


_SHORT = {"mode + wrappers": "mode", "parent lookup": "parents", "call site": "site", "module stack": "modules",
          "node creation": "nodes", "saving": "saving", "grouping": "group", "assembly": "assemble",
          "history": "history", "set-up": "set-up"}


def format_table(rows: list[dict[str, Any]], per_call: dict[str, float]) -> str:
    width = max(len(r["name"]) for r in rows) + 2
    head = (f"{'model':<{width}}{'ops':>5}{'calls':>6}{'plain ms':>9}{'total':>8}"
            + "".join(f"{_SHORT[c]:>9}" for c in CATEGORIES) + f"{'sum':>8}{'resid':>7}{'IQR':>6}{'us/call':>8}{'own set-up':>11}")
    lines = ["us per op (total = all saved - plain; sum = the categories; resid = total - sum; "
             "IQR = spread of the total between rounds; us/call = module stack per submodule call;\n"
             "own set-up = this model's us per call outside its forward and build, which 'set-up' stands for)", head]
    for r in rows:
        per_module = r["module_stack_us_per_call"]
        lines.append(
            f"{r['name']:<{width}}{r['ops']:>5}{r['module_calls']:>6}{r['plain_ms']:>9.2f}{r['total_us_per_op']:>8.1f}"
            + "".join(f"{r['us_per_op'][c]:>9.1f}" for c in CATEGORIES)
            + f"{r['sum_us_per_op']:>8.1f}{r['residual_us_per_op']:>7.1f}"
            f"{r['noise_us_per_op']:>6.1f}" + (f"{per_module:>8.1f}" if per_module is not None else f"{'-':>8}")
            + f"{r['own_set_up_us_per_call']:>11.0f}")
    lines.append(
        f"per call, Linear(8, 8) on (2, 8), no save: {per_call['log']:.0f} us logged - {per_call['plain']:.0f} us "
        f"plain = {per_call['fixed']:.0f} us fixed: api {per_call['api']:.0f}, capture set-up "
        f"{per_call['capture set-up']:.0f}, mode + wrappers {per_call['mode + wrappers']:.0f}, forward under capture "
        f"beyond them {per_call['forward under capture']:.0f}, build {per_call['build']:.0f}; every layer saved: "
        f"{per_call['fixed all saved']:.0f} us fixed. 'set-up' above is api + capture set-up = "
        f"{per_call['set-up']:.0f} us per call")
    lines.append("")
    lines.append(f"{'ms per pass (x plain)':<{width}}{'plain':>9}{'floor':>14}{'no save':>14}{'all saved':>14}")
    for r in rows:
        m = r["medians_ms"]
        plain = m["plain"]["total"]
        cells = "".join(f"{m[k]['total']:>8.2f} ({m[k]['total'] / plain:.2f})" for k in ("floor", "no save", "all saved"))
        lines.append(f"{r['name']:<{width}}{plain:>9.2f}{cells}")
    return "\n".join(lines)


_CHECKOUT = Path(torchlog.__file__).resolve().parent.parent


def _where(file: str) -> str:
    """The area a profiled function belongs to: a torchlog file, a torch file, model code or C."""
    if file == "~" or file.startswith("<"):
        return "C functions (ops, clones, builtins)"
    path = Path(file).resolve()
    if path.is_relative_to(_CHECKOUT) and path.parts[len(_CHECKOUT.parts)] in ("torchlog", "storage", "vis"):
        return str(path.relative_to(_CHECKOUT))
    parts = path.parts
    for package in ("torch", "transformers"):
        if package in parts:
            inner = parts[len(parts) - 1 - parts[::-1].index(package):]
            return "/".join(inner) if package == "torch" else "model code (transformers)"
    return "model code" if path.name == "models.py" else str(path.name)


def _function(key: tuple[str, int, str]) -> str:
    file, line, name = key
    return name if file == "~" else f"{_where(file)}:{line} {name}"


def profile_case(case: BenchCase, runs: int = 5, top: int = 15) -> str:
    """Where a logged pass of `case` spends its time under cProfile, per op."""
    model, inputs = case.build(), case.make_input()
    with torch.no_grad():
        num_ops = len(torchlog.log_forward_pass(model, inputs))
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(runs):
            torchlog.log_forward_pass(model, inputs)
        profiler.disable()
    entries = pstats.Stats(profiler).stats  # {(file, line, name): (prim calls, calls, own s, cum s, callers)}
    scale = 1e6 / (runs * num_ops)
    by_area: dict[str, float] = defaultdict(float)
    for (file, _, _), (_, _, own, _, _) in entries.items():
        by_area[_where(file)] += own
    total = sum(by_area.values())
    lines = [f"{case.name}: {total * scale:.0f} us per op under cProfile ({num_ops} ops, {runs} passes)",
             "  by file (us/op, share):"]
    for area, own in sorted(by_area.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"    {own * scale:8.1f}  {own / total:5.1%}  {area}")
    lines.append("  by function, own time (us/op, calls/op):")
    ranked = sorted(entries.items(), key=lambda kv: -kv[1][2])[:top]
    for key, (_, calls, own, _, _) in ranked:
        lines.append(f"    {own * scale:8.1f}  {calls / (runs * num_ops):6.2f}  {_function(key)}")
    return "\n".join(lines)


def _cases(args: argparse.Namespace) -> list[BenchCase]:
    if args.quick:
        return quick_cases()
    return full_cases() if args.all else [c for c in full_cases() if c.is_op_bound]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="quick_cases, few repeats: a smoke run")
    parser.add_argument("--all", action="store_true", help="every full case, not only the op-bound ones")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    parser.add_argument("--profile", action="store_true", help="then a cProfile view of the op-bound models")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(provenance_line())
    per_call = measure_per_call(5 if args.quick else 41)
    rows = []
    for case in _cases(args):
        rows.append(breakdown_case(case, 3 if args.quick else max(case.repeats, 9), per_call))
        print(f"measured {case.name}", file=sys.stderr, flush=True)
    print(format_table(rows, per_call))
    if args.json is not None:
        figures = {"setting": provenance(), "per_call_us": per_call, "categories": list(CATEGORIES), "models": rows}
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    if args.profile:
        for case in _cases(args):
            if case.is_op_bound:
                print(profile_case(case, runs=2 if args.quick else 5))


if __name__ == "__main__":
    main()
