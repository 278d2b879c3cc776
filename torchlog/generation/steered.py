"""`run_generation`: a steered generation at about the cost of a hooked `generate`, with no log."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from torchlog.errors import InvalidArgumentTypeError
from torchlog.generation.api import chosen_steps, run_steps, runner
from torchlog.generation.history import StepIntervention
from torchlog.generation.stepping import StepLogger
from torchlog.intervened import Runner
from torchlog.sites.entries import check_intervene

__all__ = ["GenerationRun", "run_generation"]


@dataclass(frozen=True, slots=True)
class GenerationRun:
    """What `run_generation` returns: the tokens and every action applied, with its step."""

    output: Any  # what generate (or the decode loop) returned; None when it raised
    sequences: torch.Tensor | None  # prompt (or decoder start) and generated tokens
    interventions: tuple[StepIntervention, ...]  # one per action applied, in order
    num_steps: int  # forward calls made (0 is the prefill)

    @property
    def tokens(self) -> torch.Tensor | None:
        """The generated tokens, one per step."""
        return None if self.sequences is None else self.sequences[..., self.sequences.shape[-1] - self.num_steps:]


def run_generation(model: nn.Module, input_ids: torch.Tensor, *, intervene: Any,
                   intervene_steps: Iterable[int] | None = None, decode: Callable[..., Any] | None = None,
                   **generate_kwargs: Any) -> GenerationRun:
    """Run `model.generate(input_ids, ...)` (or `decode(model, input_ids)`) with `intervene`
    applied at the chosen steps by `torchlog.run` (module hooks, or the lean capture), and
    keep only the tokens and the firings: the inner loop of a steering experiment. The
    tokens equal those of `log_generation` with the same arguments; the steps are not logged.

    Args:
        model: the model; left as it was (its `forward` is wrapped only while it runs).
        input_ids: the prompt's token ids, (batch, length).
        intervene: {site: action} or [(site, action), ...], or a function of the step
            returning such a spelling (or None to leave that step alone).
        intervene_steps: the steps to intervene at (0 is the prefill); None for every step.
        decode: a decode loop, `decode(model, input_ids)`, as for `log_generation`; None
            runs `model.generate`.
        **generate_kwargs: keywords for `generate` (`max_new_tokens`, `do_sample`, ...).

    Returns:
        A GenerationRun.

    Raises:
        InvalidArgumentTypeError, StepNotFoundError: as `log_generation` raises them.
        InterventionError: a site acted at no op of a step it was applied at.
        Exception: whatever generation raises, with the steps done (a GenerationRun) on
            `exc.torchlog_generation`.

    Example:
        >>> import torch, torchlog
        >>> from torchlog.interventions import add
        >>> class Counter(torch.nn.Module):  # next token: the last one plus one
        ...     def forward(self, ids):
        ...         return torch.nn.functional.one_hot((ids + 1) % 10, 10).float()
        >>> def greedy(model, ids):
        ...     for _ in range(3):
        ...         ids = torch.cat([ids, model(ids)[:, -1:].argmax(-1)], dim=-1)
        ...     return ids
        >>> bump = add(torch.eye(10)[0] * 2)   # token 0 wins wherever it is added
        >>> steered = torchlog.generation.run_generation(Counter(), torch.tensor([[4]]), decode=greedy,
        ...                                              intervene={'float': bump}, intervene_steps=[1])
        >>> steered.tokens.tolist(), [i.step for i in steered.interventions]
        ([[5, 0, 1]], [1])
    """
    start, _ = runner(model, input_ids, decode)
    if decode is not None and generate_kwargs:
        raise InvalidArgumentTypeError(
            f"run_generation got keywords {sorted(generate_kwargs)!r}, which decode= does not take "
            "(a decode loop gets only the model and input_ids)")
    if not callable(intervene):
        check_intervene(intervene)  # before the model runs
    steps = chosen_steps(intervene_steps, generate_kwargs.get("max_new_tokens"))

    # One Runner for sites that do not change with the step: the model's modules are
    # walked and the sites checked once, not at every step.
    fixed = None if callable(intervene) or intervene is None else Runner(model, intervene=intervene)

    # From its second call on, the fixed Runner keeps its module hooks in place (when its
    # sites act by hooks alone) instead of registering them at every step.
    spans: list = []

    def run_step(args: list, kwargs: dict[str, Any], step: int) -> tuple:
        spelled = intervene(step) if callable(intervene) else intervene
        if spelled is None or (steps is not None and step not in steps):
            model(*args, **kwargs)
            return ()
        if fixed is None:
            return Runner(model, intervene=spelled)(args, kwargs).interventions
        if spans:
            return (spans[0] or fixed)(args, kwargs).interventions
        fired = fixed(args, kwargs).interventions
        span = fixed.span()
        spans.append(span.__enter__() if span is not None else None)
        return fired

    def runs_once(step: int) -> bool:  # a plain call, or module sites acted on by hooks alone
        if steps is not None and step not in steps:
            return True
        return fixed is not None and fixed.runs_once

    logger = StepLogger(model, run_step, runs_once)

    def result(output: Any, sequences: torch.Tensor | None) -> GenerationRun:
        fired = tuple(StepIntervention(k, record) for k, step in enumerate(logger.steps) for record in step.result)
        return GenerationRun(output, sequences, fired, len(logger.steps))
    try:
        return run_steps(logger, start, generate_kwargs, steps, result)
    finally:
        if spans and spans[0] is not None:
            spans[0].__exit__(None, None, None)
