"""Where logging time goes: the mode alone, bookkeeping without saving, and saving.

Run: .venv/bin/python bench/breakdown.py [--quick]
One thread, process CPU time (steady on a shared machine), median of several runs. Columns:
plain forward; the same forward under a do-nothing TorchFunctionMode (the floor of this
mechanism); log_forward_pass with layers_to_save=None (capture, loop grouping, records, no
copies); and with every activation saved. Ratios are against plain, from one process.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import full_cases, quick_cases  # noqa: E402
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


if __name__ == "__main__":
    main()
