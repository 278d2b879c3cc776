"""What an intervention adds to a logged pass: the same pass logged plain and intervened, as ratios in one run.

Run: .venv/bin/python bench/intervene_bench.py [--rounds N] [--out PATH]

Models: GPT-2 (6 layers, hidden 256, 128 tokens) and ResNet-50 (224x224), from
bench/models.py. Variants, all saving every activation, under torch.no_grad():
- plain log: log_forward_pass(model, x).
- module site: one module address (a block, a stage), found while the pass runs.
- op selector: select.func(...) & select.in_module(...), tested on every op as it returns.
- label site, sites known: a label site whose plan was built beforehand from a logged pass
  (the probe is left out: "with sites known"), run through the same capture path the
  API uses.
Each action is scale(1.0) (the cost of the mechanism, not of the arithmetic) and, for the
module site, also add(vector). The variants of one model run round-robin, one of each per
round, after an untimed warm-up round; each figure is the median over rounds of process CPU
time. Prints ms per pass and the ratio to the plain log; the issue's bar is <= 1.05.
With `--device cuda` the models and inputs live on the GPU and each figure is wall time ending
with torch.cuda.synchronize().
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torchlog  # noqa: E402
sys.path.insert(0, str(ROOT / "bench"))
from provenance import cpu_model, provenance  # noqa: E402
from torchlog import select  # noqa: E402
from torchlog.api import _run  # noqa: E402
from torchlog.arguments import prepare  # noqa: E402
from torchlog.interventions import add, scale  # noqa: E402
from torchlog.options import LogOptions  # noqa: E402


def _bench_models() -> Any:
    spec = importlib.util.spec_from_file_location("bench_models", ROOT / "bench" / "models.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_models"] = module
    spec.loader.exec_module(module)
    return module


def _known_label_run(model: torch.nn.Module, x: torch.Tensor, site: str) -> Callable[[], Any]:
    """A call that runs the label-site pass with its plan already built (no probe)."""
    options = LogOptions(intervene={site: scale(1.0)}, random_seed=0)
    request = prepare(model, x, None, options)
    probe = torchlog.log_forward_pass(model, x, layers_to_save=None, random_seed=0)
    plan = request.acting.plan(probe)
    capture = replace(request.capture, plan=plan)
    return lambda: _run(request, capture, time.perf_counter(), prune=False)


def _variants(name: str, model: torch.nn.Module, x: torch.Tensor) -> dict[str, Callable[[], Any]]:
    if name.startswith("GPT-2"):
        module, inside, func, label = "transformer.h.2", "transformer.h.2.attn", "scaled_dot_product_attention", "scaleddotproductattention_3_"
        width = model.config.n_embd
    else:
        module, inside, func, label = "layer3", "layer3.2", "relu", "relu_"
        width = None
    probe = torchlog.log_forward_pass(model, x, layers_to_save=None, random_seed=0)
    label = next(l for l in probe.layer_labels if l.startswith(label))
    found: dict[str, Callable[[], Any]] = {
        "plain log": lambda: torchlog.log_forward_pass(model, x, random_seed=0),
        f"module site {module!r}": lambda: torchlog.log_forward_pass(
            model, x, random_seed=0, intervene={module: scale(1.0)}),
        f"op selector func({func!r}) & in_module({inside!r})": lambda: torchlog.log_forward_pass(
            model, x, random_seed=0, intervene={select.func(func) & select.in_module(inside): scale(1.0)}),
        f"label site {label!r}, sites known": _known_label_run(model, x, label),
    }
    if width is not None:
        vector = torch.randn(width, device=x.device)
        found[f"module site {module!r}, add(vector)"] = lambda: torchlog.log_forward_pass(
            model, x, random_seed=0, intervene={module: add(vector)})
    # The plain log again, last in each round: a check on order effects within a round.
    found["plain log (again, last in the round)"] = found["plain log"]
    return found


def _measure(variants: dict[str, Callable[[], Any]], rounds: int, device: str = "cpu") -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in variants}
    for name, run in variants.items():  # warm-up
        run()
    for _ in range(rounds):
        for name, run in variants.items():
            gc.collect()  # the previous variant's garbage is not this one's cost
            if device == "cpu":
                start = time.process_time()
                result = run()
                times[name].append(time.process_time() - start)
            else:
                torch.cuda.synchronize()
                start = time.perf_counter()
                result = run()
                torch.cuda.synchronize()
                times[name].append(time.perf_counter() - start)
            del result
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    models = _bench_models()
    device = args.device
    cases = [("GPT-2 (6 layers)", models.gpt2_small().to(device), torch.randint(0, 1000, (1, 128)).to(device)),
             ("ResNet-50 224x224", models.resnet50().to(device), torch.randn(1, 3, 224, 224).to(device))]
    if device == "cpu":
        lines = [f"intervene_bench: torchlog {provenance()['commit']}, {cpu_model()}, {torch.get_num_threads()} "
                 f"thread, {args.rounds} rounds, median process CPU time"]
    else:
        lines = [f"intervene_bench: torchlog {provenance()['commit']}, {torch.cuda.get_device_name()} "
                 f"(torch {torch.__version__}), {args.rounds} rounds, median wall time to synchronize"]
    with torch.no_grad():
        for name, model, x in cases:
            medians = _measure(_variants(name, model, x), args.rounds, device)
            base = medians["plain log"]
            lines.append(f"{name}")
            for variant, value in medians.items():
                lines.append(f"  {variant:<60} {value * 1e3:9.1f} ms   x{value / base:.3f}")
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
