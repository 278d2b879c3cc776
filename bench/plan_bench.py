"""What the plan stage costs: one pass where the sites can be decided while it runs, as ratios in one run.

Run: .venv/bin/python bench/plan_bench.py [--rounds N] [--out PATH]

GPT-2 (6 layers, hidden 256, 64 tokens; bench/models.py) and the seed's SimpleRecurrent, one
thread, under torch.no_grad(). Rows, each a ratio to its own baseline measured in the same
round-robin (one of each per round, after an untimed warm-up round; median process CPU time):
- layers_to_save=['transformer.h.3'] against saving every layer (bar: <= 0.8).
- an intervened pass with a label site against the same pass with the module-address site
  whose output that label is (bar: <= 1.1), each scale(1.0).
- torchlog.run with the module site against a plain forward with one forward hook doing
  the same edit (bar: <= 1.2); for SimpleRecurrent, whose ops are tiny, the mode's own
  per-op floor dominates, so its figure is reported, not barred; there the site is a label
  of the loop (every pass), run through the lean capture.
- the model's calls per log_forward_pass call for each kind of site (a forward pre-hook
  counts them; kept probes dropped first, so a probe shows).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torchlog  # noqa: E402
from round_robin import bench_models, measure, report  # noqa: E402
from provenance import cpu_model, provenance, provenance_line  # noqa: E402
from torchlog import select  # noqa: E402
from torchlog.interventions import scale  # noqa: E402
from torchlog.sites.probes import PROBES  # noqa: E402


def _hooked(model: torch.nn.Module, module: torch.nn.Module, x: Any) -> Callable[[], Any]:
    def edit(m: Any, args: Any, out: Any) -> Any:
        return out * 1.0 if isinstance(out, torch.Tensor) else (out[0] * 1.0,) + tuple(out[1:])

    def run() -> Any:
        handle = module.register_forward_hook(edit)
        try:
            return model(x)
        finally:
            handle.remove()
    return run


def _gpt2_rows(model: torch.nn.Module, x: torch.Tensor, rounds: int) -> list[str]:
    site = "transformer.h.3"
    label = torchlog.log_forward_pass(model, x, layers_to_save=None)[site].label
    variants = {
        "save every layer": lambda: torchlog.log_forward_pass(model, x, random_seed=0),
        f"layers_to_save=[{site!r}]": lambda: torchlog.log_forward_pass(model, x, random_seed=0, layers_to_save=[site]),
        f"module site {site!r}": lambda: torchlog.log_forward_pass(model, x, random_seed=0, intervene={site: scale(1.0)}),
        f"label site {label!r}": lambda: torchlog.log_forward_pass(model, x, random_seed=0, intervene={label: scale(1.0)}),
        "plain forward, one hook": _hooked(model, model.transformer.h[3], x),
        f"torchlog.run, module site {site!r}": lambda: torchlog.run(model, x, intervene={site: scale(1.0)}),
        f"torchlog.run, label site {label!r}": lambda: torchlog.run(model, x, intervene={label: scale(1.0)}),
        "plain forward": lambda: model(x),
    }
    m = measure(variants, rounds)
    names = list(variants)
    return [
        f"  {names[1]:<52} x{m[names[1]] / m[names[0]]:.3f} of saving every layer (bar <= 0.8)",
        f"  {names[3]:<52} x{m[names[3]] / m[names[2]]:.3f} of the module site (bar <= 1.1)",
        f"  {names[5]:<52} x{m[names[5]] / m[names[4]]:.3f} of a plain forward with one hook (bar <= 1.2)",
        f"  {names[6]:<52} x{m[names[6]] / m[names[4]]:.3f} of a plain forward with one hook",
        f"  {names[4]:<52} x{m[names[4]] / m[names[7]]:.3f} of a plain forward",
        "  ms: " + ", ".join(f"{name} {value * 1e3:.1f}" for name, value in m.items()),
    ]


def _recurrent_rows(model: torch.nn.Module, x: torch.Tensor, rounds: int) -> list[str]:
    label = next(p for p in torchlog.log_forward_pass(model, x, layers_to_save=None).passes
                 if p.func_name == "__add__" or p.func_name == "add").label.split(":")[0]
    variants = {
        "plain forward, one hook": _hooked(model, model.fc, x),
        "torchlog.run, module site 'fc'": lambda: torchlog.run(model, x, intervene={"fc": scale(1.0)}),
        f"torchlog.run, label site {label!r}": lambda: torchlog.run(model, x, intervene={label: scale(1.0)}),
        "log_forward_pass, module site 'fc'": lambda: torchlog.log_forward_pass(model, x, intervene={"fc": scale(1.0)}),
    }
    m = measure(variants, rounds)
    base = m["plain forward, one hook"]
    return [f"  {name:<52} x{value / base:.3f} of a plain forward with one hook ({value * 1e3:.2f} ms)"
            for name, value in m.items() if name != "plain forward, one hook"]


def _calls_rows(model: torch.nn.Module, x: torch.Tensor) -> list[str]:
    full = torchlog.log_forward_pass(model, x, layers_to_save=None)
    softmax = next(p.label for p in full.passes if p.func_name in ("softmax", "scaled_dot_product_attention"))
    dropout = next((p.label for p in full.passes if p.func_name == "dropout"), softmax)
    rows = {
        "log_forward_pass(m, x)": {},
        "layers_to_save=['lm_head' or last block]": dict(layers_to_save=["transformer.h.5"]),
        "intervene={'transformer.h.1': ...}": dict(intervene={"transformer.h.1": scale(1.0)}),
        f"intervene={{{softmax!r}: ...}}": dict(intervene={softmax: scale(1.0)}),
        "intervene={dropout label: ...}": dict(intervene={dropout: scale(1.0)}),
        "stop_after='transformer.h.0'": dict(stop_after="transformer.h.0"),
        "stop_after='transformer.h.0:1'": dict(stop_after="transformer.h.0:1"),
        "intervene={module_input('transformer.h.1'): ...}": dict(
            intervene={select.module_input("transformer.h.1"): scale(1.0)}),
        "layers_to_save=['dotproduct'] (a substring)": dict(layers_to_save=["dotproduct"]),
    }
    counted = [0]
    handle = model.register_forward_pre_hook(lambda m, a: counted.__setitem__(0, counted[0] + 1))
    lines = []
    try:
        for name, keywords in rows.items():
            PROBES.drop_model(model)
            counted[0] = 0
            torchlog.log_forward_pass(model, x, **keywords)
            lines.append(f"  {name:<52} {counted[0]} model call(s)")
    finally:
        handle.remove()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    models = bench_models()
    torch.manual_seed(0)
    gpt2, ids = models.gpt2_small().eval(), torch.randint(0, 1000, (1, 64))
    recurrent, series = models.SimpleRecurrent().eval(), torch.rand(2, 5)
    lines = [provenance_line(), f"plan_bench: torchlog {provenance()['commit']}, {cpu_model()}, {torch.get_num_threads()} thread, "
             f"{args.rounds} rounds, median process CPU time, torch.no_grad()"]
    with torch.no_grad():
        lines.append("GPT-2 (6 layers, hidden 256, 64 tokens)")
        lines += _gpt2_rows(gpt2, ids, args.rounds)
        lines.append("SimpleRecurrent (the seed's loop model)")
        lines += _recurrent_rows(recurrent, series, args.rounds)
        lines.append("Model calls per log_forward_pass call, GPT-2 (6 layers), no kept probe")
        lines += _calls_rows(gpt2, ids)
    report(lines, args.out)


if __name__ == "__main__":
    main()
