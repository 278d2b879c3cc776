"""Counterfactual replay against an intervened rerun of the model: the same intervention, as ratios in one run.

Run: .venv/bin/python bench/replay_bench.py [--rounds N] [--save]

`--save` also writes the output to bench/results/replay-gpt2-6layers-<commit>-<machine>.txt.

Model: GPT-2 (6 layers, hidden 256, bench/models.py gpt2_small) at 16 and 128 tokens, under
torch.no_grad(). The history replayed from is logged once beforehand with
save_function_args=True (not timed: it is the run one patches from). Sites, all in the last
block, each with scale(1.5):
- 'transformer.h.5.ln_1': the block's first op, so the whole last block, ln_f and the head
  are recomputed (the most a site in that block costs replay);
- 'transformer.h.5': the block's output, so only ln_f and the head are recomputed;
- the block's attention softmax by label: a label site, which the rerun finds on a first
  logged pass (log_forward_pass runs the model twice), replay in the history itself.
For each site, the rerun is log_forward_pass(model, x, intervene={site: action}) and the
replay torchlog.replay.replay(history, {site: action}); each pair is checked equal at the
output before timing. The two run alternately, one of each per round, after an untimed
warm-up; each figure is the median over rounds of process CPU time. Prints ms per call and
rerun / replay from the medians and from the fastest run of each (the issue's bar: at least 5).
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torchlog  # noqa: E402
from torchlog.interventions import scale  # noqa: E402
from torchlog.replay import replay  # noqa: E402
from provenance import provenance  # noqa: E402


def _bench_models() -> Any:
    spec = importlib.util.spec_from_file_location("bench_models", ROOT / "bench" / "models.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_models"] = module
    spec.loader.exec_module(module)
    return module


def _sites(history: torchlog.ModelHistory) -> list[Any]:
    """The three sites of the docstring, the label one found in `history`."""
    softmax = next(p.label for p in history if p.module == "transformer.h.5.attn"
                   and p.func_name in ("softmax", "scaled_dot_product_attention"))
    return ["transformer.h.5.ln_1", "transformer.h.5", softmax]


def _pair(model: torch.nn.Module, x: torch.Tensor, history: torchlog.ModelHistory,
          site: Any) -> dict[str, Callable[[], Any]]:
    intervene = {site: scale(1.5)}
    calls = {"rerun": lambda: torchlog.log_forward_pass(model, x, random_seed=0, intervene=intervene),
             "replay": lambda: replay(history, intervene)}
    rerun, replayed = calls["rerun"](), calls["replay"]()
    if not torch.equal(rerun[-1].tensor_contents, replayed[-1].tensor_contents):
        raise AssertionError(f"replay and rerun differ at the output for site {site!r}")
    return calls


def _measure(calls: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in calls}
    for run in calls.values():  # warm-up
        run()
    for _ in range(rounds):
        for name, run in calls.items():
            gc.collect()  # the other call's garbage is not this one's cost
            start = time.process_time()
            result = run()
            times[name].append(time.process_time() - start)
            del result
    return times


def _machine() -> str:
    """'amd-epyc-2cores': the CPU model and the cores this process may use, for file names."""
    found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M) \
        if Path("/proc/cpuinfo").exists() else None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{re.sub(r'[^a-z0-9]+', '-', (found[1] if found else 'unknown-cpu').lower()).strip('-')}-{cores}cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--save", action="store_true",
                        help="also write bench/results/replay-gpt2-6layers-<commit>-<machine>.txt")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = _bench_models().gpt2_small()
    setting = provenance()
    lines = [f"# {setting['date']}; torchlog {setting['commit']}; {setting['uptime']}; command: "
             f"{setting['command']}",
             f"replay_bench: {_machine()}, torch {torch.__version__}, {torch.get_num_threads()} thread, "
             f"{args.rounds} rounds, median process CPU time, GPT-2 (6 layers, hidden 256), scale(1.5)"]
    with torch.no_grad():
        for tokens in (16, 128):
            x = torch.randint(0, 1000, (1, tokens), generator=torch.Generator().manual_seed(0))
            history = torchlog.log_forward_pass(model, x, random_seed=0, save_function_args=True)
            lines.append(f"{tokens} tokens ({len(history)} passes)")
            for site in _sites(history):
                times = _measure(_pair(model, x, history, site), args.rounds)
                rerun, replayed = (statistics.median(times[k]) for k in ("rerun", "replay"))
                fastest = min(times["rerun"]) / min(times["replay"])
                lines.append(f"  site {site!r:<36} rerun {rerun * 1e3:7.2f} ms  replay {replayed * 1e3:6.2f} ms  "
                             f"rerun/replay x{rerun / replayed:5.2f} (fastest runs x{fastest:5.2f})")
    text = "\n".join(lines)
    print(text)
    if args.save:
        commit = setting["commit"].removesuffix("+dirty")  # the header line keeps the mark
        path = ROOT / "bench" / "results" / f"replay-gpt2-6layers-{commit}-{_machine()}.txt"
        path.write_text(text + "\n")
        print(f"written to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
