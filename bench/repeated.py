"""Milliseconds per `log_forward_pass` in a loop of calls, as an extraction loop runs them.

Run `.venv/bin/python bench/repeated.py [--json PATH]` (`--quick`: a smoke run of two small models).

bench/run.py times each sample after `gc.collect()`, so that every sample starts from the
same heap; a loop that logs batch after batch does not, and there Python's cyclic garbage
collector sweeps the records of each new history as they are made. This script times that
loop: each model logged n times in a row (every layer saved, 1 thread, CPU clock, under
torch.no_grad()), each new history replacing the last, five rounds, the median round.
It prints the ms per call (plain forward time included) and the plain forward beside it.
With TORCHLOG_CHECKOUT (see bench/checkout/sitecustomize.py) it times another checkout.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from time import process_time

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torchlog  # noqa: E402
from models import DeepMLP, SimpleRecurrent, _seed_input, _tokens, gpt2_small, tiny_llama  # noqa: E402


def cases(quick: bool = False) -> dict:
    """name -> (model, input, calls per round); with `quick`, two small models, few calls."""
    if quick:
        return {"Linear(8, 8) on (2, 8)": (torch.nn.Linear(8, 8).eval(), torch.randn(2, 8), 20),
                "SimpleRecurrent (seed)": (SimpleRecurrent().eval(), _seed_input(), 10)}
    return {
        "Linear(8, 8) on (2, 8)": (torch.nn.Linear(8, 8).eval(), torch.randn(2, 8), 1000),
        "SimpleRecurrent (seed)": (SimpleRecurrent().eval(), _seed_input(), 400),
        "MLP (50 blocks)": (DeepMLP(50).eval(), torch.randn(32, 256), 40),
        "GPT-2 (6 layers)": (gpt2_small(), _tokens(1, 128, 1000), 10),
        "LLaMA (2 layers)": (tiny_llama(), _tokens(1, 128, 1000), 30),
    }


def per_call_ms(fn, calls: int, rounds: int = 5) -> float:
    """Median over rounds of the CPU ms per call of `fn`, called `calls` times in a row."""
    samples = []
    for _ in range(rounds):
        start = process_time()
        for _ in range(calls):
            kept = fn()  # the previous result is freed when the next replaces it, as in a loop
        samples.append((process_time() - start) / calls * 1e3)
        del kept
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--quick", action="store_true", help="two small models, few calls: a smoke run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = {}
    rounds = 2 if args.quick else 5
    with torch.no_grad():
        for name, (model, x, calls) in cases(args.quick).items():
            for _ in range(3):  # warm-up
                torchlog.log_forward_pass(model, x)
            logged = per_call_ms(lambda: torchlog.log_forward_pass(model, x), calls, rounds)
            plain = per_call_ms(lambda: model(x), calls, rounds)
            rows[name] = {"log_ms": logged, "plain_ms": plain}
    print(f"torchlog from {Path(torchlog.__file__).parent}; ms per call in a loop of calls")
    print(f"{'model':<24} {'log ms':>9} {'plain ms':>9}")
    for name, row in rows.items():
        print(f"{name:<24} {row['log_ms']:>9.3f} {row['plain_ms']:>9.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"torchlog": str(Path(torchlog.__file__).parent), "rows": rows},
                                              indent=2))


if __name__ == "__main__":
    main()
