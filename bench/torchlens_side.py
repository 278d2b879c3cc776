"""The TorchLens half of the benchmark, run by bench/run.py in an interpreter that has torchlens.

TorchLens wraps torch functions on first use and leaves them wrapped, which would slow
every later measurement, so it never shares a process with torchlog's figures. This
script measures the same models the same way (bench/run.py's timing and memory code)
and prints the results as one JSON line. It only calls TorchLens's public API.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import (CLOCKS, NOT_INSTALLED, LogResult, Logger, case_named, cases_for, child_flags,  # noqa: E402
                 configure, measure, memory_child)


def _trace(model: torch.nn.Module, inputs: Any) -> Any:
    """Log one pass with TorchLens, every layer saved, nothing rendered.

    Raises:
        ImportError: torchlens is not installed in this interpreter.
    """
    import torchlens

    return torchlens.trace(model, inputs)  # saves every layer and renders nothing by default


def _describe(trace: Any, existing: set[int]) -> LogResult:
    return LogResult(len(trace), int(trace.saved_activation_memory))


TORCHLENS = Logger("TorchLens", _trace, _describe)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    parser.add_argument("--memory-child", metavar="CASE")
    parser.add_argument("--mode", choices=("plain", "log"))
    args = parser.parse_args(argv)
    configure(args)
    if args.memory_child:
        case = case_named(args.memory_child, args.quick)
        print(json.dumps(memory_child(case, TORCHLENS, args.mode)))
        return 0
    try:
        import torchlens  # noqa: F401
    except ImportError as exc:
        print(f"not installed in {sys.executable}: {exc}", file=sys.stderr)
        return NOT_INSTALLED
    child = None if args.no_memory else [sys.executable, __file__] + child_flags(args)
    # TorchLens takes seconds per pass: three timed runs are enough to see its cost.
    # TorchLens leaves torch wrapped after its first trace, so the plain runs go first.
    repeats = args.repeats or 3
    results = measure(cases_for(args.quick), TORCHLENS, child, repeats,
                      lambda s: print(s, file=sys.stderr, flush=True), plain_first=True)
    print(json.dumps([asdict(r) for r in results]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
