"""`log_generation`: a model's `generate` (or a decode loop) logged one forward call per step."""
from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import fields, replace
from typing import Any

import torch
from torch import nn

from torchlog.errors import (
    GenerationError,
    IncompleteLogWarning,
    InvalidArgumentTypeError,
    InvalidOptionError,
    StepNotFoundError,
)
from torchlog.api import log_forward_pass
from torchlog.generation.history import GenerationHistory
from torchlog.generation.saving import GenerationSaver
from torchlog.generation.stepping import StepLogger
from torchlog.model_state import is_compiled
from torchlog.options import LogOptions

__all__ = ["log_generation", "run_steps", "runner", "chosen_steps", "num_beams"]

_LOG_FIELDS = frozenset(f.name for f in fields(LogOptions))
# Options a step cannot honour: a stopped or returned-on-error step has no output for
# generate to continue from.
_REFUSED = {"stop_after": None, "on_error": "raise"}


def log_generation(model: nn.Module, input_ids: torch.Tensor, *, decode: Callable[..., Any] | None = None,
                   intervene: Any = None, intervene_steps: Iterable[int] | None = None,
                   options: LogOptions | None = None, **keywords: Any) -> GenerationHistory:
    """Run `model.generate(input_ids, ...)` (or `decode(model, input_ids)`) with each forward
    call logged as one step, and return the GenerationHistory.

    The tokens are exactly those of the same call without torchlog: each step's output is
    the model's own, and the random generators are as they were after each forward (each
    step seeds its own pass and restores them, so sampling draws what it would draw).

    Args:
        model: the model; left as it was (its `forward` is wrapped only while it runs).
        input_ids: the prompt's token ids, (batch, length).
        decode: a decode loop, `decode(model, input_ids)`, calling the model once per step
            and returning the sequences (prompt and new tokens), for a model with no
            `generate` or a loop of your own. None runs `model.generate`.
        intervene: {site: action} or [(site, action), ...] as `log_forward_pass` takes
            them, applied at every step in `intervene_steps`; or a function of the step
            returning such a spelling, or None to leave that step alone.
        intervene_steps: the steps to intervene at (0 is the prefill: `[0]` edits the
            prompt only); None for every step.
        options: LogOptions for every step (`layers_to_save`, `random_seed`, ...).
            `save_to` names one HDF5 file for the whole generation: each step streams its
            values to a scratch log while it runs and is appended to the file when it
            ends, and the steps' histories read their values back from the file
            (`torchlog.load_generation` opens it again).
        **keywords: LogOptions fields by name (`layers_to_save=['transformer.h.1']`); every
            other keyword goes to `generate` (`max_new_tokens`, `do_sample`, ...).

    Returns:
        The GenerationHistory: `gen.steps[k]` is step k's ModelHistory.

    Raises:
        InvalidArgumentTypeError: no `generate` and no `decode`; a bad `decode`,
            `intervene` or `intervene_steps`; a rendering keyword.
        InvalidOptionError: an option a step cannot honour (`stop_after`,
            `on_error='return'`, `save_gradients` with `save_to`), or `intervene` given twice.
        LogFileExistsError, LogFileNotFoundError, LogFileError: `save_to` is an existing
            file (without `overwrite=True`), a folder, or in a folder that does not exist.
        StepNotFoundError: a step of `intervene_steps` beyond `max_new_tokens`, or one
            generation did not reach (then the generation is on `exc.torchlog_generation`).
        Exception: whatever generation raises, unchanged, with the steps done on
            `exc.torchlog_generation` and one note.

    Example:
        >>> import torch, torchlog
        >>> class Counter(torch.nn.Module):  # next token: the last one plus one
        ...     def forward(self, ids):
        ...         return torch.nn.functional.one_hot((ids + 1) % 10, 10).float()
        >>> def greedy(model, ids):
        ...     for _ in range(3):
        ...         ids = torch.cat([ids, model(ids)[:, -1:].argmax(-1)], dim=-1)
        ...     return ids
        >>> gen = torchlog.log_generation(Counter(), torch.tensor([[4]]), decode=greedy)
        >>> gen.tokens.tolist(), gen.num_steps, gen.token(2).tolist()
        ([[5, 6, 7]], 3, [7])
    """
    run, model_name = runner(model, input_ids, decode)
    generate_kwargs = {k: v for k, v in keywords.items() if k not in _LOG_FIELDS}
    if decode is not None and generate_kwargs:
        raise InvalidArgumentTypeError(
            f"log_generation got keywords {sorted(generate_kwargs)!r}, which are neither LogOptions fields "
            "nor used with decode= (a decode loop gets only the model and input_ids)")
    options = _step_options(options, {k: v for k, v in keywords.items() if k in _LOG_FIELDS}, intervene)
    steps = chosen_steps(intervene_steps, generate_kwargs.get("max_new_tokens"))
    options_for = _options_per_step(options, intervene, steps)
    beams = 1 if decode is not None else num_beams(model, generate_kwargs)
    saver = None if options.save_to is None else GenerationSaver(  # checked last: it creates the file
        options.save_to, options.overwrite, model_name, input_ids, beams)
    logger = StepLogger(model, _step_runner(model, options_for, saver, lambda: logger.steps))

    def result(output: Any, sequences: torch.Tensor | None) -> GenerationHistory:
        return GenerationHistory(model_name, input_ids, logger.steps, output, sequences, num_beams=beams,
                                 path=None if saver is None else saver.path)
    if saver is None:
        return run_steps(logger, run, generate_kwargs, steps, result)
    return _saved_run(saver, lambda: run_steps(logger, run, generate_kwargs, steps, result), logger)


def _step_runner(model: nn.Module, options_for: Callable[[int], LogOptions], saver: GenerationSaver | None,
                 done: Callable[[], list]) -> Callable[[list, dict[str, Any], int], Any]:
    """What runs step k: `log_forward_pass` with that step's options, streamed through
    `saver` into the generation file when there is one (`done()`: the steps logged so far)."""
    def log_step(args: list, kwargs: dict[str, Any], k: int) -> Any:
        if saver is None:
            return log_forward_pass(model, args, kwargs, options=options_for(k))
        return saver.run_step(lambda to: log_forward_pass(model, args, kwargs, options=replace(
            options_for(k), save_to=to, overwrite=False)), k, done())
    return log_step


def _saved_run(saver: GenerationSaver, run: Callable[[], GenerationHistory], logger: StepLogger) -> GenerationHistory:
    """`run()`, with the generation file finished whatever happens: 'complete' with the
    sequences when generation returned (also when a chosen step was never reached),
    'incomplete' with the steps done when it raised. A failure to finish the file never
    replaces generation's own error: it becomes an IncompleteLogWarning."""
    try:
        gen = run()
    except BaseException as error:
        done = getattr(error, "torchlog_generation", None)
        sequences = None if done is None else done.sequences
        try:
            saver.finish(logger.steps, sequences, None if sequences is not None else f"{type(error).__name__}: {error}")
        except Exception as failed:  # the user's exception matters more; the steps done are in the file
            warnings.warn(f"generation file {saver.path!r} was left unfinished: {failed}", IncompleteLogWarning,
                          stacklevel=3)
        raise
    saver.finish(logger.steps, gen.sequences, None)
    return gen


def num_beams(model: nn.Module, generate_kwargs: dict[str, Any]) -> int:
    """The beams per prompt generate will run: `num_beams=`, else that of the
    `generation_config=` given, else the model's generation config's (1 when none)."""
    if generate_kwargs.get("num_beams") is not None:
        found = generate_kwargs["num_beams"]
    else:
        config = generate_kwargs.get("generation_config") or getattr(model, "generation_config", None)
        found = getattr(config, "num_beams", None) or 1
    if not isinstance(found, int) or isinstance(found, bool) or found < 1:
        raise InvalidArgumentTypeError(f"num_beams must be an int >= 1, got {found!r}")
    return found


def run_steps(logger: StepLogger, run: Callable, generate_kwargs: dict[str, Any], steps: frozenset[int] | None,
              result: Callable[[Any, torch.Tensor | None], Any]) -> Any:
    """Run the generation under `logger` and return `result(output, sequences)`.

    Raises:
        Exception: what generation raised, with `result(None, None)` (the steps done) on
            `exc.torchlog_generation` and a note.
        StepNotFoundError: a step of `steps` was never reached.
    """
    try:
        with logger:
            output = run(generate_kwargs)
        sequences = _sequences(output)
    except Exception as error:
        error.torchlog_generation = result(None, None)
        error.add_note(f"torchlog: generation raised at step {len(logger.steps)}; the {len(logger.steps)} "
                       "steps done are in exc.torchlog_generation")
        raise
    done = result(output, sequences)
    _check_steps_reached(steps, len(logger.steps), done)
    return done


def runner(model: nn.Module, input_ids: Any, decode: Callable | None) -> tuple[Callable, str]:
    """What runs the generation (given generate's keywords), and the model's name."""
    if not isinstance(model, nn.Module) or is_compiled(model):
        raise InvalidArgumentTypeError(
            f"log_generation takes an nn.Module (not torch.compile'd), got {type(model).__name__}")
    if not isinstance(input_ids, torch.Tensor) or input_ids.is_floating_point() or input_ids.dim() != 2:
        shown = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise InvalidArgumentTypeError(
            f"input_ids must be a (batch, length) tensor of token ids, got {shown!r}")
    name = type(model).__name__
    if decode is not None:
        if not callable(decode):
            raise InvalidArgumentTypeError(f"decode must be a function decode(model, input_ids), got {decode!r}")
        return (lambda _: decode(model, input_ids)), name
    if not callable(getattr(model, "generate", None)):
        raise InvalidArgumentTypeError(
            f"{name} has no generate method (it is not a Hugging Face GenerationMixin model); pass "
            "decode=, a function decode(model, input_ids) that calls the model once per step and "
            "returns the sequences")
    return (lambda kwargs: model.generate(input_ids, **kwargs)), name


def _step_options(options: LogOptions | None, keywords: dict[str, Any], intervene: Any) -> LogOptions:
    """The LogOptions every step starts from, checked before anything runs."""
    if options is not None and not isinstance(options, LogOptions):
        raise InvalidArgumentTypeError(f"options must be a torchlog.LogOptions or None, got {options!r}")
    merged = replace(options or LogOptions(), **keywords)
    if merged.intervene is not None and intervene is not None:
        raise InvalidOptionError("intervene was given both in options and as log_generation(intervene=...); "
                                 "give it once")
    if merged.save_to is not None and merged.save_gradients:
        raise InvalidOptionError(
            "log_generation cannot honour save_gradients=True with save_to: a later backward would "
            "write gradients into each step's log after the step was appended to the generation file; "
            "save gradients in memory (no save_to) or leave save_gradients off")
    for name, allowed in _REFUSED.items():
        if getattr(merged, name) != allowed:
            raise InvalidOptionError(
                f"log_generation cannot honour {name}={getattr(merged, name)!r}: every step must run to "
                "its end and return its output to generate; leave it at its default")
    if intervene is not None and not callable(intervene):
        merged = replace(merged, intervene=intervene)  # checked now, before the model runs
    return merged


def chosen_steps(steps: Iterable[int] | None, max_new_tokens: Any) -> frozenset[int] | None:
    """`intervene_steps` as a set, checked; None for every step."""
    if steps is None:
        return None
    if isinstance(steps, (str, bytes)) or not isinstance(steps, Iterable):
        raise InvalidArgumentTypeError(f"intervene_steps must be an iterable of step numbers, got {steps!r}")
    chosen = list(steps)
    for step in chosen:
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise InvalidArgumentTypeError(
                f"intervene_steps holds {step!r}; steps are ints >= 0 (0 is the prefill)")
        if isinstance(max_new_tokens, int) and step >= max_new_tokens:
            raise StepNotFoundError(
                f"intervene_steps holds step {step!r}, but max_new_tokens={max_new_tokens} runs steps "
                f"0..{max_new_tokens - 1} (0 is the prefill)")
    return frozenset(chosen)


def _options_per_step(options: LogOptions, intervene: Any, steps: frozenset[int] | None) -> Callable[[int], LogOptions]:
    """The LogOptions of step k: the shared ones, with the interventions of that step."""
    quiet = replace(options, intervene=None)

    def options_for(step: int) -> LogOptions:
        if steps is not None and step not in steps:
            return quiet
        if callable(intervene):
            return replace(options, intervene=intervene(step))
        return options
    return options_for


def _sequences(output: Any) -> torch.Tensor:
    """The token sequences in what generate or decode returned (a tensor or `.sequences`).

    Raises:
        GenerationError: it holds no integer tensor of sequences.
    """
    sequences = output if isinstance(output, torch.Tensor) else getattr(output, "sequences", None)
    if not isinstance(sequences, torch.Tensor) or sequences.is_floating_point() or sequences.dim() != 2:
        raise GenerationError(
            f"the generation returned {type(output).__name__}, with no (batch, length) tensor of token "
            "ids; a decode loop must return the sequences (prompt and new tokens)")
    return sequences


def _check_steps_reached(steps: frozenset[int] | None, num_steps: int, generation: Any) -> None:
    """Refuse a chosen intervention step that generation never reached (it stopped early)."""
    missed = sorted(step for step in steps or () if step >= num_steps)
    if missed:
        error = StepNotFoundError(
            f"intervene_steps holds step(s) {missed!r}, but generation ended after {num_steps} "
            f"steps (EOS or a stopping criterion), so they were never intervened on; the generation is on "
            "exc.torchlog_generation")
        error.torchlog_generation = generation
        raise error
