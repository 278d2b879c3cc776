"""What any recorder built on a TorchFunctionMode pays before doing anything: the floor.

Run: .venv/bin/python bench/floor.py [--quick] [--json PATH]

Two tables, one thread, CPU clock, under torch.no_grad():

- per kind of call: one call alone (a C function, a Tensor method, an operator, a metadata
  read, and Python functionals from torch.nn.functional), timed plain and under a mode whose
  `__torch_function__` only calls the function. A Python functional (`F.layer_norm`,
  `F.softmax`) reaches the mode through torch's Python-level `handle_torch_function`, which
  pops the mode with a generator-based context manager: it costs several times what a C
  function does, and nothing outside torch can change that.
- per model: the forward under that do-nothing mode (no module wrappers, nothing recorded)
  against the plain forward, in µs per op of the model's history; the calls the mode sees
  per op (metadata reads such as `x.size()` and `x.shape` reach it too, and are no ops); and
  how many of them are Python functionals. The floor is what a per-op budget (issue 16 asks
  for 30 µs) must leave room for before any bookkeeping.

Each figure is the median of several rounds; plain and mode runs alternate within a round.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import types
from collections.abc import Callable
from pathlib import Path
from time import perf_counter_ns, process_time
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torchlog  # noqa: E402
from models import full_cases, quick_cases  # noqa: E402
from provenance import provenance, provenance_line  # noqa: E402


class _NullMode(TorchFunctionMode):
    """Sees every call and does nothing but run it; counts them by kind when asked."""

    def __init__(self, counts: dict[str, int] | None = None) -> None:
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        if self.counts is not None:
            kind = "python" if isinstance(func, types.FunctionType) else "builtin"
            self.counts[kind] = self.counts.get(kind, 0) + 1
        return func(*args, **(kwargs or {}))


def _calls() -> dict[str, Callable[[], Any]]:
    x, y, w = torch.randn(4, 8), torch.randn(4, 8), torch.randn(8, 8)
    return {
        "torch.add (C function)": lambda: torch.add(x, y),
        "x + y (operator)": lambda: x + y,
        "x.view(32) (Tensor method)": lambda: x.view(32),
        "x.size(-1) (metadata read)": lambda: x.size(-1),
        "F.linear (C functional)": lambda: F.linear(x, w),
        "F.softmax (Python functional)": lambda: F.softmax(x, -1),
        "F.layer_norm (Python functional)": lambda: F.layer_norm(x, (8,)),
        "F.silu (Python functional)": lambda: F.silu(x),
    }


def _per_call_us(call: Callable[[], Any], number: int) -> float:
    start = perf_counter_ns()
    for _ in range(number):
        call()
    return (perf_counter_ns() - start) / number / 1e3


def measure_calls(rounds: int, number: int) -> list[dict[str, Any]]:
    """µs per call of each kind, plain and under the do-nothing mode (medians of rounds)."""
    rows = []
    with torch.no_grad():
        for name, call in _calls().items():
            plain, moded = [], []
            for _ in range(rounds):
                plain.append(_per_call_us(call, number))
                with _NullMode():
                    moded.append(_per_call_us(call, number))
            p, m = statistics.median(plain), statistics.median(moded)
            rows.append({"call": name, "plain_us": p, "mode_us": m, "extra_us": m - p})
    return rows


def _forward(model: torch.nn.Module, inputs: Any) -> None:
    if isinstance(inputs, dict):
        model(**inputs)
    else:
        model(inputs)


def measure_model(case: Any, rounds: int) -> dict[str, Any]:
    """The do-nothing mode's cost per op of `case`, and the calls it sees per op."""
    model, inputs = case.build(), case.make_input()
    with torch.no_grad():
        ops = len(torchlog.log_forward_pass(model, inputs, layers_to_save=None))
        counts: dict[str, int] = {}
        with _NullMode(counts):
            _forward(model, inputs)
        plain, moded = [], []
        _forward(model, inputs)
        for _ in range(rounds):
            start = process_time()
            _forward(model, inputs)
            plain.append(process_time() - start)
            with _NullMode():
                start = process_time()
                _forward(model, inputs)
                moded.append(process_time() - start)
    p, m = statistics.median(plain), statistics.median(moded)
    seen = sum(counts.values())
    return {"name": case.name, "ops": ops, "plain_ms": p * 1e3, "mode_ms": m * 1e3,
            "floor_us_per_op": (m - p) * 1e6 / ops, "mode_calls_per_op": seen / ops,
            "python_functionals_per_op": counts.get("python", 0) / ops}


def format_tables(calls: list[dict[str, Any]], models: list[dict[str, Any]]) -> str:
    width = max(len(r["call"]) for r in calls) + 2
    lines = ["us per call, alone (plain; under a do-nothing TorchFunctionMode; the difference)",
             f"{'call':<{width}}{'plain':>8}{'mode':>8}{'extra':>8}"]
    lines += [f"{r['call']:<{width}}{r['plain_us']:>8.2f}{r['mode_us']:>8.2f}{r['extra_us']:>8.2f}" for r in calls]
    width = max(len(r["name"]) for r in models) + 2
    lines += ["", "per model: the do-nothing mode alone (no module wrappers, nothing recorded)",
              f"{'model':<{width}}{'ops':>6}{'plain ms':>10}{'mode ms':>10}{'floor us/op':>13}"
              f"{'calls/op':>10}{'py fn/op':>10}"]
    lines += [f"{r['name']:<{width}}{r['ops']:>6}{r['plain_ms']:>10.2f}{r['mode_ms']:>10.2f}"
              f"{r['floor_us_per_op']:>13.1f}{r['mode_calls_per_op']:>10.2f}{r['python_functionals_per_op']:>10.2f}"
              for r in models]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small models, few rounds: a smoke run")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(provenance_line())
    calls = measure_calls(3 if args.quick else 9, 200 if args.quick else 5000)
    cases = quick_cases() if args.quick else [c for c in full_cases() if c.is_op_bound]
    models = [measure_model(case, 3 if args.quick else max(case.repeats, 15)) for case in cases]
    print(format_tables(calls, models))
    if args.json is not None:
        args.json.write_text(json.dumps({"setting": provenance(), "calls": calls, "models": models}, indent=1) + "\n")


if __name__ == "__main__":
    main()
