"""Attribution patching: every site's effect at once, from one backward pass of the corrupted run.

The effect of patching site s is estimated to first order as
`(clean_s - corrupted_s) . d metric / d s`, the gradient taken on the corrupted run. The
corrupted run goes through the same patched-run machinery as a sweep, with an edit at every
site that adds a zero which requires grad (the value is unchanged, and the site joins the
autograd graph even when the model's parameters are frozen); `torch.autograd.grad` then
gives every site's gradient without touching any parameter's `.grad`.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from torchlog.errors import InvalidOptionError
from torchlog.model_state import model_kept
from torchlog.patching.result import PatchResult, PatchRow
from torchlog.patching.runs import Edit, run_patched
from torchlog.patching.site_sweep import module_of
from torchlog.patching.sweep_setup import (check_corrupted, check_metrics, check_positions, number,
                                          prepare_sweep)

__all__ = ["attribution"]


def attribution(model: nn.Module, clean: Any, corrupted: Any, sites: Any, metric: Callable[[Any], Any], *,
                positions: Sequence[int] | None = None, position_dim: int = 1,
                input_kwargs: dict | None = None) -> PatchResult:
    """Estimate every site's patching effect from one corrupted forward and one backward.

    Takes the arguments of `sweep` (no batch_size: it is one run) and returns a PatchResult
    with the same rows, whose metric is the first-order estimate
    `corrupted_metric + (clean - corrupted) . grad`. Exact where the ops between a site and
    the metric are linear.

    Raises:
        InvalidOptionError: the metric does not depend on the activations by a gradient
            (an integer output), or it is equal (or not finite) on the clean and corrupted
            outputs; and what `sweep` raises for bad sites and metrics.

    Example:
        >>> import torch, torchlog
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
        >>> est = torchlog.patching.attribution(net, torch.ones(1, 2), torch.zeros(1, 2), ['0', '1'],
        ...                                     lambda out: out.sum())
        >>> [round(row.effect, 5) for row in est]
        [1.0, 1.0]
    """
    # The corrupted run is the gradient's run itself: it counts its calls for the check.
    setup = prepare_sweep(model, clean, corrupted, sites, metric, input_kwargs, run_corrupted=False)
    check_positions(setup, positions, position_dim)
    kept: dict[str, torch.Tensor] = {}

    def joiner(label: str) -> Callable[[torch.Tensor], torch.Tensor]:
        def join(value: torch.Tensor) -> torch.Tensor:
            kept[label] = value
            if not (value.is_floating_point() or value.is_complex()):
                return value  # no gradient reaches an integer value: its estimate is 0
            zero = torch.zeros((), dtype=value.dtype, device=value.device, requires_grad=True)
            kept[label] = joined = value + zero
            return joined

        return join

    edits = [Edit(target, joiner(target.record.label)) for target in setup.targets]
    calls: list = []
    with torch.enable_grad(), model_kept(list(model.named_modules())):
        output = run_patched(model, setup.corrupted, setup.kwargs, edits, setup.named, calls=calls)
        check_corrupted(setup, calls, {label: tuple(value.shape) for label, value in kept.items()})
        value = metric(output)
        if not isinstance(value, torch.Tensor) or not value.requires_grad:
            number(value, "metric(output)")  # not a number at all: named as such
            raise InvalidOptionError(
                f"attribution needs a metric that is a differentiable tensor of the output, got "
                f"{value!r:.80}; compute it with torch ops from the output's floating-point values "
                "(e.g. a logit difference)")
        setup.corrupted_metric = number(value, "metric(corrupted output)")
        check_metrics(setup.clean_metric, setup.corrupted_metric)
        labels = [label for label, joined in kept.items() if joined.requires_grad]
        grads = torch.autograd.grad(value.reshape(()), [kept[label] for label in labels], allow_unused=True)
    gradient = dict(zip(labels, grads))
    rows: list[PatchRow] = []
    gap = setup.clean_metric - setup.corrupted_metric
    for target in setup.targets:
        label = target.record.label
        grad = gradient.get(label)
        sums: Any = None  # the estimate of the whole value, or per position: one sum per position
        if grad is not None:
            product = (setup.clean_values[label].to(kept[label].dtype) - kept[label].detach()) * grad
            sums = float(product.sum()) if positions is None else product.sum(
                [d for d in range(product.dim()) if d != position_dim]).tolist()
        for position in positions if positions is not None else [None]:
            estimate = 0.0 if sums is None else sums if position is None else sums[position]
            metric_estimate = setup.corrupted_metric + estimate
            effect = estimate / gap  # check_metrics refused gap == 0
            rows.append(PatchRow(target.site, label, module_of(target.record), position, metric_estimate, effect))
    return PatchResult(rows, setup.clean_metric, setup.corrupted_metric, "attribution", setup.history)
