"""Each forward call of a generation as one step: the model's forward wrapped while it generates."""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as module_hooks

from torchlog.errors import GenerationError
from torchlog.generation.carried_buffers import CarriedBuffers
from torchlog.generation.rerun_state import ArgumentState
from torchlog.model_state import model_kept

__all__ = ["LoggedStep", "StepLogger"]


@dataclass(frozen=True, slots=True)
class LoggedStep:
    """One forward call of a generation: what the step's runner returned for it (its
    ModelHistory, or a cheap run's firings) and what the call read and returned."""

    result: Any  # what `run_step` returned: a ModelHistory, or a tuple of InterventionRecord
    input_ids: torch.Tensor | None  # the tokens it read (None when forward got no token ids)
    logits: torch.Tensor | None  # its output logits at the last position, detached


class StepLogger:
    """While entered, every call of `model` is one step, run by `run_step`.

    The model's instance `forward` is set to a wrapper for the duration and put back on
    exit (the attribute the user had, or none), also when generation raises. The model's
    own forward hooks and pre-hooks run once per step, around the run inside the step as
    around a plain call: the call from outside runs none (they are held apart from it, and
    put back for the step's runs and on exit), else a hook that edits the output would
    edit it twice. A call from
    outside (generate, a decode loop) is a step: `run_step(args, kwargs, k)` runs it, by
    calling the model again (through `log_forward_pass`, `torchlog.run` or plainly); such
    an inner call runs the original forward, whose output is handed back to the outer
    caller unchanged.

    Args:
        model: the model whose calls are steps.
        run_step: runs step k, calling the model with its arguments at least once, and
            returns what the step keeps (`LoggedStep.result`).
        runs_once: whether step k will call the model exactly once (then its arguments
            are not snapshotted: nothing runs after the run that could read them); None
            for every step maybe more than once. A second run of such a step raises.
    """

    def __init__(self, model: nn.Module, run_step: Callable[[list, dict[str, Any], int], Any],
                 runs_once: Callable[[int], bool] | None = None) -> None:
        self.model, self.run_step, self.runs_once = model, run_step, runs_once
        self.steps: list[LoggedStep] = []
        self._original = model.forward  # the bound forward (or the user's own instance attribute)
        self._had_own = "forward" in vars(model)
        self._inside = False
        self._before: ArgumentState | None = None  # the arguments as the step was given them
        self._after: ArgumentState | None = None  # as the step's last run left them
        self._written: torch.Tensor | None = None  # a given tensor a run wrote into
        self._runs = 0  # runs of the model in the current step
        self._output: Any = None
        # The model's hook tables, and what each held while the call from outside runs.
        self._hook_tables = (model._forward_pre_hooks, model._forward_hooks)
        self._held: tuple[dict, ...] = ()
        self._carried = CarriedBuffers(model)  # buffers carry from step to step
        self._kept = model_kept(list(model.named_modules()))  # and are put back after the generation

    def __enter__(self) -> StepLogger:
        def forward(*args: Any, **kwargs: Any) -> Any:
            return self._run(args, kwargs) if self._inside else self._step(args, kwargs)
        # The original's signature and name: log_forward_pass reads forward's parameters.
        self._kept.__enter__()
        self.model.forward = functools.update_wrapper(forward, self._original)
        self._hold_hooks()
        return self

    def __exit__(self, *exc_info: object) -> bool:
        self._put_hooks_back()
        self._kept.__exit__(*exc_info)
        if self._had_own:
            self.model.forward = self._original
        else:
            vars(self.model).pop("forward", None)
        return False

    def _hold_hooks(self) -> None:
        """Empty the model's hook tables (the same dicts: handles keep working) for the call
        from outside, keeping what they held."""
        if any(self._hook_tables):
            self._held = tuple(dict(table) for table in self._hook_tables)
            for table in self._hook_tables:
                table.clear()

    def _put_hooks_back(self) -> None:
        for table, held in zip(self._hook_tables, self._held):
            table.update(held)
        self._held = ()

    def _step(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        """Run one call as the next step and return what forward returned."""
        once = self.runs_once is not None and self.runs_once(len(self.steps))
        self._before = None if once else ArgumentState(args, kwargs)
        self._after, self._written, self._runs = None, None, 0
        self._inside = True
        self._put_hooks_back()
        self._carried.start()
        try:
            result = self.run_step(list(args), kwargs, len(self.steps))
            output = self._output
            self._carried.put_back()
        finally:
            self._hold_hooks()
            if self._after is not None:
                self._after.restore()  # the cache as the last run left it, for the next step
            self._inside, self._before, self._after, self._output = False, None, None, None
        self.steps.append(LoggedStep(result, _token_ids(args, kwargs), _last_logits(output)))
        return output

    def _run(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        """One run of the original forward inside a logged step. Each run leaves the
        arguments as the step was given them, since the next run's capture reads them
        before forward starts.

        Raises:
            GenerationError: a second run, when the first wrote into a tensor it was given.
        """
        self._runs += 1
        if self._before is None:  # a step said to run once: no snapshot to restore
            if self._runs > 1:
                raise GenerationError(f"step {len(self.steps)} was to call the model once and called it again")
            return self._ran(self._original(*args, **kwargs))
        if self._written is not None:
            raise GenerationError(
                f"a step wrote into a tensor of shape {tuple(self._written.shape)} it was given (a "
                "static KV cache) and then had to run the model again (to find its sites on a probe, "
                "or to copy a saved value): the second run would read the written cache. Name "
                "intervention sites and layers_to_save by module address or full label, which need "
                "one run, or generate with a dynamic cache")
        try:
            output = self._original(*args, **kwargs)
        finally:
            self._written = self._before.written()
            self._after = ArgumentState(args, kwargs)
            self._before.restore()
        return self._ran(output)

    def _ran(self, output: Any) -> Any:
        """Keep what this run's call returns once every forward hook registered before it
        ran (the user's, torchlog's edits at the model's output): the output the step hands
        back. A hook added now runs after them, and removes itself."""
        self._output = output
        self._carried.ran()
        if not (self.model._forward_hooks or module_hooks._global_forward_hooks):
            return output  # no hook can hand back another output
        handle = None

        def keep(module: nn.Module, args: tuple, returned: Any) -> None:
            self._output = returned
            handle.remove()
        handle = self.model.register_forward_hook(keep)
        return output


def _token_ids(args: tuple, kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The token ids a forward call read: `input_ids` (or `decoder_input_ids`), else its
    first positional integer tensor."""
    for name in ("input_ids", "decoder_input_ids"):
        if isinstance(kwargs.get(name), torch.Tensor):
            return kwargs[name].detach()
    first = args[0] if args else None
    if isinstance(first, torch.Tensor) and not first.is_floating_point():
        return first.detach()
    return None


def _last_logits(output: Any) -> torch.Tensor | None:
    """The logits at the last position of what forward returned: its `logits`, its first
    element, or the tensor itself."""
    logits = getattr(output, "logits", None)
    if logits is None and isinstance(output, (tuple, list)) and output:
        logits = output[0]
    if logits is None and isinstance(output, torch.Tensor):
        logits = output
    if not isinstance(logits, torch.Tensor) or logits.dim() < 2:
        return None
    last = logits[..., -1, :] if logits.dim() >= 3 else logits
    return last.detach().clone()  # a copy: a view would keep the whole logits alive
