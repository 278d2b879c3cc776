"""Timing variants as ratios in one run: each variant once per round, after an untimed warm-up
round, the median of process CPU time; and the bench models loaded by path."""
from __future__ import annotations

import gc
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent


def bench_models() -> Any:
    """bench/models.py as a module (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location("bench_models", BENCH / "models.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_models"] = module
    spec.loader.exec_module(module)
    return module


def measure(variants: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Median process CPU seconds per variant: one of each per round, round after round, so
    that a drift in the machine's load reaches them all; garbage collected before each."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for run in variants.values():  # warm-up (also keeps any probe a variant needs)
        run()
    for _ in range(rounds):
        for name, run in variants.items():
            gc.collect()
            start = time.process_time()
            result = run()
            times[name].append(time.process_time() - start)
            del result
    return {name: statistics.median(values) for name, values in times.items()}


def report(lines: list[str], out: Path | None) -> None:
    """Print a bench's lines, and write them to `out` when given (its result file)."""
    text = "\n".join(lines)
    print(text)
    if out is not None:
        out.write_text(text + "\n")
