"""Time loop grouping (torchlog/loops.py) on recurrent models of growing size.

Run: .venv/bin/python bench/loops_bench.py
Prints ops, layers, grouping seconds and seconds per 1,000 ops; the target is a
2,000-op model with loops grouped in under 1 s on the 2-core CI machine.
"""
from __future__ import annotations

import time

import torch
from torch import nn

from torchlog.capture import CaptureOptions, run_captured
from torchlog.loops import group_into_layers


class LoopModel(nn.Module):
    """A loop with a parameter op, parameter-free ops and a nested parameter-free loop."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.steps = steps
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.steps):
            h = torch.tanh(self.fc(x))
            for _ in range(2):
                h = torch.sin(h) * 0.5
            x = x + h
        return x


class ParamFreeChain(nn.Module):
    """Only parameter-free ops, the hardest case for the grouping (no anchors)."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.steps = steps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.steps):
            x = torch.cos(torch.sin(x) * 2) + x
        return x


def main() -> None:
    print(f"{'model':<16}{'ops':>8}{'layers':>8}{'group s':>10}{'s / 1k ops':>12}")
    for cls in (LoopModel, ParamFreeChain):
        for steps in (50, 200, 400, 800):
            captured = run_captured(cls(steps), (torch.rand(2, 8),), {},
                                    CaptureOptions(save_all=False, save_indices=frozenset()))
            start = time.perf_counter()
            layers = group_into_layers(captured.nodes)
            elapsed = time.perf_counter() - start
            n = len(captured.nodes)
            print(f"{cls.__name__:<16}{n:>8}{len(layers):>8}{elapsed:>10.3f}{elapsed / n * 1000:>12.4f}")


if __name__ == "__main__":
    main()
