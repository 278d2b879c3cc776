"""What logging a generation costs: a steered `generate` logged step by step, as ratios to the
same `generate` with one plain forward hook, in one run.

Run: .venv/bin/python bench/generation_bench.py [--rounds N] [--out PATH]

Model: GPT-2 (6 layers, hidden 256, vocabulary 1000) from bench/models.py, a prompt of 32
tokens, 16 new tokens, greedy, on one CPU thread. Variants:
- hooked generate: `model.generate` with a forward hook adding a vector to block 2's output
  (the baseline: what a user writes by hand).
- run_generation: the same edit as `intervene=`, applied per step by `torchlog.run` (module
  hooks); no log, only tokens and firings.
- log_generation, steered, nothing saved: the same edit as `intervene=`, `layers_to_save=None`
  (each step is still a full metadata log).
- log_generation, steered, one block saved: `layers_to_save=['transformer.h.5']`.
- log_generation, steered, everything saved: the default `layers_to_save='all'`.
The variants run round-robin, one of each per round, after an untimed warm-up round; each
figure is the median over rounds of process CPU time. The issue's bar for a steered generation
that keeps only its tokens (run_generation) is <= 1.2x the hooked generate. Every variant's
tokens are checked equal first.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torchlog  # noqa: E402
sys.path.insert(0, str(ROOT / "bench"))
from round_robin import bench_models, measure, report  # noqa: E402
from provenance import cpu_model, provenance  # noqa: E402
from torchlog.interventions import add  # noqa: E402

NEW_TOKENS = 16
SITE = "transformer.h.2"


def _hooked(model: torch.nn.Module, prompt: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
    def steer(module: torch.nn.Module, args: tuple, output: Any) -> Any:
        return (output[0] + vector, *output[1:]) if isinstance(output, tuple) else output + vector

    handle = model.get_submodule(SITE).register_forward_hook(steer)
    try:
        return model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
    finally:
        handle.remove()


def _variants(model: torch.nn.Module, prompt: torch.Tensor, vector: torch.Tensor) -> dict[str, Callable[[], Any]]:
    def logged(layers: Any) -> Callable[[], Any]:
        return lambda: torchlog.log_generation(model, prompt, intervene={SITE: add(vector)}, layers_to_save=layers,
                                               max_new_tokens=NEW_TOKENS, do_sample=False)
    return {
        "hooked generate": lambda: _hooked(model, prompt, vector),
        "run_generation, steered": lambda: torchlog.generation.run_generation(
            model, prompt, intervene={SITE: add(vector)}, max_new_tokens=NEW_TOKENS, do_sample=False),
        "log_generation, steered, nothing saved": logged(None),
        "log_generation, steered, one block saved": logged(["transformer.h.5"]),
        "log_generation, steered, everything saved": logged("all"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = bench_models().gpt2_small()
    torch.manual_seed(0)
    prompt = torch.randint(0, 999, (1, 32))
    vector = torch.randn(model.config.n_embd)
    tokens = {name: run() for name, run in _variants(model, prompt, vector).items()}
    sequences = [t if isinstance(t, torch.Tensor) else t.sequences for t in tokens.values()]
    assert all(torch.equal(s, sequences[0]) for s in sequences), "a variant generated other tokens"
    medians = measure(_variants(model, prompt, vector), args.rounds)
    base = medians["hooked generate"]
    lines = [f"generation_bench: torchlog {provenance()['commit']}, {cpu_model()}, {torch.get_num_threads()} "
             f"thread, {args.rounds} rounds, median process CPU time; GPT-2 (6 layers), prompt 32, "
             f"{NEW_TOKENS} new tokens"]
    for variant, value in medians.items():
        lines.append(f"  {variant:<45} {value * 1e3:9.1f} ms   x{value / base:.2f}")
    report(lines, args.out)


if __name__ == "__main__":
    main()
