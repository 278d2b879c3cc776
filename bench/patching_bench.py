"""Patching sweeps against the plain-PyTorch way (a forward hook per patched run), as ratios in one run.

Run: .venv/bin/python bench/patching_bench.py [--rounds N] [--out PATH]

Model: GPT-2 (6 layers, hidden 256, 16 tokens; bench/models.py), every block output x 16
positions = 96 patched runs, metric a logit difference at the last position, torch.no_grad().
- hook loop (baseline): for each block and position, a plain forward with one forward hook
  writing the clean value (captured beforehand) into that block's output at that position;
  what a TransformerLens-style loop does.
- sweep, batch_size=None / 16: torchlog.patching.sweep over select.module_type('GPT2Block')
  with positions=range(16); its set-up (one logged pass of the clean input, one lean pass of
  the corrupted one) is inside the time, and printed apart. The prompts differ at token 3, so
  at tokens 0-2 a causal model's clean and corrupted values agree at every block: the sweep
  does not run those 18 patches (they would write the values already there). The variant
  "prompts differing at token 0" runs all 96.
- plain forward on 16 rows: the model on the corrupted input repeated 16 times; six of them
  (96 runs / 16) are what batch_size=16 would cost if every batched run computed the whole model.
- attribution: torchlog.patching.attribution over the same rows, in forward-equivalents
  (its time / one plain forward), set-up included and apart.
- per-run fixed cost: one patched run of nn.Linear(8, 8) on a (2, 8) input (a hook edit
  through torchlog.patching.runs.run_patched, and a lean-capture edit) minus a plain forward.
Variants run round-robin, medians of process CPU time, one thread. With `--device cuda` the
model and inputs live on the GPU, each timing is wall time ending with torch.cuda.synchronize(),
and the per-run fixed cost (a CPU figure) is left out.
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torchlog  # noqa: E402
sys.path.insert(0, str(ROOT / "bench"))
from provenance import cpu_model, provenance  # noqa: E402
from torchlog import select  # noqa: E402
from torchlog.patching import attribution, sweep  # noqa: E402
from torchlog.patching.runs import Edit, run_patched  # noqa: E402
from torchlog.patching.site_sweep import _writes_nothing  # noqa: E402
from torchlog.patching.sweep_setup import find_targets, prepare_sweep  # noqa: E402


def _bench_models() -> Any:
    spec = importlib.util.spec_from_file_location("bench_models", ROOT / "bench" / "models.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_models"] = module
    spec.loader.exec_module(module)
    return module


def _metric(out: Any) -> torch.Tensor:
    logits = out.logits if hasattr(out, "logits") else out[0]
    return logits[0, -1, 5] - logits[0, -1, 7]


def _hook_loop(model: Any, clean: torch.Tensor, corrupted: torch.Tensor, kwargs: dict) -> list[float]:
    blocks = list(model.transformer.h)
    values = []
    handles = [b.register_forward_hook(lambda m, a, out: values.append(out[0].detach().clone() if isinstance(out, tuple) else out.detach().clone()))
               for b in blocks]
    try:
        model(clean, **kwargs)
    finally:
        for h in handles:
            h.remove()
    found = []
    for block, value in zip(blocks, values):
        for position in range(clean.shape[1]):
            def patch(module, args, out, value=value, position=position):
                hidden = out[0] if isinstance(out, tuple) else out
                new = hidden.clone()
                new[:, position] = value[:, position]
                return (new, *out[1:]) if isinstance(out, tuple) else new

            handle = block.register_forward_hook(patch)
            try:
                found.append(float(_metric(model(corrupted, **kwargs))))
            finally:
                handle.remove()
    return found


def _timed(runs: dict[str, Callable[[], Any]], rounds: int, device: str = "cpu") -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():
        run()
    clock = time.process_time if device == "cpu" else time.perf_counter
    for _ in range(rounds):
        for name, run in runs.items():
            if device != "cpu":
                torch.cuda.synchronize()
            start = clock()
            run()
            if device != "cpu":
                torch.cuda.synchronize()
            times[name].append(clock() - start)
    return {name: statistics.median(v) for name, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    models = _bench_models()
    model = models.gpt2_small(num_layers=6, hidden=256).to(args.device)
    torch.manual_seed(0)
    clean = torch.randint(0, 1000, (1, 16)).to(args.device)
    corrupted = clean.clone()
    corrupted[0, 3] = (clean[0, 3] + 1) % 1000
    corrupted_first = clean.clone()  # differs at token 0: no patch writes the values already there
    corrupted_first[0, 0] = (clean[0, 0] + 1) % 1000
    repeated = corrupted.repeat(16, 1)
    kwargs = {"use_cache": False}
    sites = select.module_type("GPT2Block")
    positions = list(range(16))
    lines = []
    with torch.no_grad():
        worst = 0.0
        for other in (corrupted, corrupted_first):
            oracle = _hook_loop(model, clean, other, kwargs)
            for batch_size in (None, 16):
                check = sweep(model, clean, other, sites, _metric, positions=positions, input_kwargs=kwargs,
                              batch_size=batch_size, progress=False)
                worst = max([worst] + [abs(r.metric - o) for r, o in zip(check, oracle)])
        setup = prepare_sweep(model, clean, corrupted, [sites], _metric, kwargs)
        not_run = sum(_writes_nothing(setup, target, position, 1) for target in setup.targets for position in positions)
        runs = {
            "plain forward": lambda: model(corrupted, **kwargs),
            "plain forward on 16 rows": lambda: model(repeated, **kwargs),
            "hook loop (96 runs)": lambda: _hook_loop(model, clean, corrupted, kwargs),
            "sweep, batch_size=None": lambda: sweep(model, clean, corrupted, sites, _metric, positions=positions,
                                                     input_kwargs=kwargs, progress=False),
            "sweep, batch_size=16": lambda: sweep(model, clean, corrupted, sites, _metric, positions=positions,
                                                   input_kwargs=kwargs, batch_size=16, progress=False),
            "sweep, batch_size=16, prompts differing at token 0": lambda: sweep(
                model, clean, corrupted_first, sites, _metric, positions=positions, input_kwargs=kwargs,
                batch_size=16, progress=False),
            "sweep set-up (1 logged pass + 1 lean pass)": lambda: prepare_sweep(
                model, clean, corrupted, [sites], _metric, kwargs),
        }
        medians = _timed(runs, args.rounds, args.device)
    medians.update(_timed({  # with grad, as attribution runs
        "attribution": lambda: attribution(model, clean, corrupted, sites, _metric, positions=positions,
                                           input_kwargs=kwargs),
        "attribution set-up (1 logged pass)": lambda: prepare_sweep(model, clean, corrupted, [sites], _metric,
                                                                    kwargs, run_corrupted=False),
    }, args.rounds, args.device))
    base, loop = medians["plain forward"], medians["hook loop (96 runs)"]
    if args.device == "cpu":
        lines.append(f"patching_bench: torchlog {provenance()['commit']}, {cpu_model()}, 1 thread, "
                     f"{args.rounds} rounds, median process CPU time")
    else:
        lines.append(f"patching_bench: torchlog {provenance()['commit']}, {torch.cuda.get_device_name()} "
                     f"(torch {torch.__version__}), {args.rounds} rounds, median wall time to synchronize")
    lines.append(f"GPT-2 (6 layers, hidden 256, 16 tokens), 6 blocks x 16 positions; sweeps vs hook loops max |metric diff| "
                 f"{worst:.2e}; patches not run (they write the values already there): {not_run} of "
                 f"{len(setup.targets) * len(positions)}")
    for name, value in medians.items():
        lines.append(f"  {name:<52} {value * 1e3:9.1f} ms   x{value / loop:.3f} of the hook loop   "
                     f"{value / base:7.1f} forwards")
    attribution_setup = medians["attribution set-up (1 logged pass)"]
    lines.append(f"  attribution without set-up: {(medians['attribution'] - attribution_setup) / base:.1f} "
                 "forward-equivalents")
    lines.append(f"  six forwards on 16 rows (batch_size=16 computing the whole model each time): "
                 f"x{6 * medians['plain forward on 16 rows'] / loop:.3f} of the hook loop")
    if args.device == "cpu":
        lines += _fixed_cost(args.rounds)
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


def _fixed_cost(rounds: int) -> list[str]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8))
    x = torch.randn(2, 8)
    history = torchlog.log_forward_pass(net, x, layers_to_save=None)
    (module_target,) = find_targets(history, ["0"])
    op_target = module_target.__class__(module_target.site, module_target.record, None, module_target.call)
    named = dict(net.named_modules())
    fn = lambda v: v + 0.0  # noqa: E731
    runs = {
        "plain": lambda: net(x),
        "hook edit": lambda: run_patched(net, (x,), {}, [Edit(module_target, fn)], named),
        "lean edit": lambda: run_patched(net, (x,), {}, [Edit(op_target, fn)], named),
    }
    with torch.no_grad():
        times: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(rounds * 40):
            for name, run in runs.items():
                start = time.perf_counter_ns()
                for _ in range(50):
                    run()
                times[name].append((time.perf_counter_ns() - start) / 50)
    med = {k: statistics.median(v) for k, v in times.items()}
    return [f"per-run fixed cost on nn.Linear(8, 8): plain {med['plain'] / 1e3:.1f} us; patched run minus plain: "
            f"hook edit {(med['hook edit'] - med['plain']) / 1e3:.1f} us, lean edit {(med['lean edit'] - med['plain']) / 1e3:.1f} us"]


if __name__ == "__main__":
    main()
