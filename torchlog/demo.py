"""The built-in example model that `python -m torchlog demo` logs."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

__all__ = ["DemoNet", "run_demo"]


class DemoNet(nn.Module):
    """A small CNN with a residual branch and a recurrent refinement loop."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.refine = nn.Linear(8, 8)
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = x + self.block(x)
        h = torch.flatten(self.pool(x), 1)
        for _ in range(3):
            h = torch.tanh(self.refine(h)) + h
        return self.head(h)


def run_demo(html_path: str | None = None) -> str:
    """Log DemoNet on a random image and return the printed history.

    With `html_path`, also write the interactive viewer there and say where it is.
    """
    import torchlog

    model = DemoNet().eval()
    history = torchlog.log_forward_pass(model, torch.rand(1, 3, 32, 32), random_seed=0)
    parts = [str(history), "", str(history["refine:2"]), "", str(history.layer("refine"))]
    if html_path is not None:
        written = Path(history.to_html(html_path)).resolve()
        parts += ["", f"Interactive viewer written to {written} (open it in a browser)"]
    return "\n".join(parts)
