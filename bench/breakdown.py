"""Where logging time goes: the mode alone, bookkeeping without saving, and saving.

Run: .venv/bin/python bench/breakdown.py [--quick]
One thread, process CPU time (steady on a shared machine), median of several runs. Columns:
plain forward; the same forward under a do-nothing TorchFunctionMode (the floor of this
mechanism); log_forward_pass with layers_to_save=None (capture, loop grouping, records, no
copies); and with every activation saved. Ratios are against plain, from one process.

`--profile` then runs cProfile over a few logged passes of each op-bound model and shows
where the time goes, in microseconds per op: per source file (torchlog's own modules
by path; torch's Python layers such as torch/overrides.py and torch/nn/modules/module.py;
the model's code; C functions, the ops themselves among them) and the functions that cost
most by their own time. cProfile inflates every Python call, so read shares, not totals.
"""
from __future__ import annotations

import cProfile
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import BenchCase, full_cases, quick_cases  # noqa: E402
from provenance import provenance_line  # noqa: E402

import torchlog  # noqa: E402


class _NullMode(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return sorted(times)[len(times) // 2] * 1e3


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


def main() -> None:
    quick = "--quick" in sys.argv
    torch.set_num_threads(1)
    print(provenance_line())
    print(f"{'model':<20}{'ops':>6}{'plain ms':>10}{'null mode':>11}{'no save':>13}{'all saved':>13}"
          f"{'bookkeeping us/op':>19}")
    for case in quick_cases() if quick else full_cases():
        model, inputs = case.build(), case.make_input()
        repeats = 3 if quick else case.repeats

        def under_null():
            with _NullMode():
                model(inputs)

        with torch.no_grad():
            plain = _median_ms(lambda: model(inputs), repeats)
            null = _median_ms(under_null, repeats)
            nosave = _median_ms(lambda: torchlog.log_forward_pass(model, inputs, layers_to_save=None), repeats)
            full = _median_ms(lambda: torchlog.log_forward_pass(model, inputs), repeats)
            ops = len(torchlog.log_forward_pass(model, inputs, layers_to_save=None))
        print(f"{case.name:<20}{ops:>6}{plain:>10.1f}{null:>7.1f} {null / plain:>3.2f}"
              f"{nosave:>8.1f} ({nosave / plain:.2f}){full:>8.1f} ({full / plain:.2f})"
              f"{(nosave - plain) / ops * 1e3:>19.1f}")
    if "--profile" in sys.argv:
        for case in quick_cases() if quick else full_cases():
            if case.is_op_bound:
                print(profile_case(case, runs=2 if quick else 5))


if __name__ == "__main__":
    main()
