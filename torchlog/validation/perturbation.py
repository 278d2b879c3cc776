"""Perturbing a saved value: different values of the same shape, dtype and layout."""
from __future__ import annotations

import torch

__all__ = ["largest_finite", "perturbed"]


def perturbed(t: torch.Tensor, generator: torch.Generator, scale: float = 1.0) -> torch.Tensor | None:
    """Different values of the same shape, dtype and layout; None when none exist.

    Floats are drawn at the size of the largest of `t`'s finite values, `scale` (the
    size of the op's output, so a change is not lost next to a large operand) and 1,
    kept finite in `t`'s dtype; integers stay inside the dtype's range.
    """
    if t.numel() == 0:
        return None
    cpu = t.detach().cpu()
    if t.dtype == torch.bool:
        new = torch.randint(0, 2, t.shape, generator=generator).bool()
    elif t.is_floating_point() or t.is_complex():
        size = max(largest_finite(cpu), scale, 1.0)
        if not t.is_complex():
            size = min(size, torch.finfo(t.dtype).max / 8)  # randn reaches ~6 sigma
        new = torch.randn(t.shape, generator=generator, dtype=torch.float64) * size
        new = new.to(t.dtype) if not t.is_complex() else (new + 1j * new.flip(-1)).to(t.dtype)
    else:
        info = torch.iinfo(t.dtype)
        low, high = min(int(cpu.min()), 0), max(int(cpu.max()), 1)
        # randint draws int64 below its exclusive upper bound: stay inside both ranges.
        high = min(high + 1, info.max, torch.iinfo(torch.int64).max)
        new = torch.randint(max(low, info.min), high, t.shape, generator=generator).to(t.dtype)
    if torch.equal(new, cpu):
        return None
    return new.to(t.device)


def largest_finite(t: torch.Tensor) -> float:
    """The largest absolute finite value in `t` (0.0 for none or a non-float tensor)."""
    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return 0.0
    size = t.detach().abs()
    finite = size[torch.isfinite(size)]
    return float(finite.max()) if finite.numel() else 0.0
