"""GenerationHistory: one logged generation, its forward calls as a steps axis of ModelHistory."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, overload

import torch

from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError, LayerNotFoundError, StepNotFoundError
from torchlog.generation.stacking import beam_path, join_steps, sequence_dim
from torchlog.generation.stepping import LoggedStep
from torchlog.history import ModelHistory
from torchlog.interventions.records import InterventionRecord
from torchlog.optional import require

__all__ = ["GenerationHistory", "StepIntervention", "Steps"]


@dataclass(frozen=True, slots=True)
class StepIntervention:
    """One action applied at one step of a generation (`gen.interventions`)."""

    step: int  # the step it acted in (0 is the prefill)
    record: InterventionRecord  # what it did there, as that step's history records it

    def __str__(self) -> str:
        return f"step {self.step}: {self.record}"


class Steps(Sequence):
    """The steps of a generation, each a ModelHistory; step 0 is the prompt's prefill."""

    def __init__(self, histories: tuple[ModelHistory, ...]) -> None:
        self._histories = histories

    @overload
    def __getitem__(self, step: int) -> ModelHistory: ...
    @overload
    def __getitem__(self, step: slice) -> tuple[ModelHistory, ...]: ...

    def __getitem__(self, step: int | slice) -> ModelHistory | tuple[ModelHistory, ...]:
        """The history of a step (negative counts from the end), or a slice of them.

        Raises:
            StepNotFoundError: the step is out of range; the message gives the range.
            InvalidArgumentTypeError: `step` is not an int or slice.
        """
        if isinstance(step, slice):
            return self._histories[step]
        return self._histories[self.index(step)]

    def index(self, step: Any) -> int:  # type: ignore[override]
        """`step` as a position from the start.

        Raises:
            StepNotFoundError, InvalidArgumentTypeError: see `__getitem__`.
        """
        if not isinstance(step, int) or isinstance(step, bool):
            raise InvalidArgumentTypeError(
                f"a step is an int (0 is the prefill, 1 the first decoding step), got {step!r} of "
                f"type {type(step).__name__}")
        n = len(self._histories)
        if not -n <= step < n:
            raise StepNotFoundError(f"step {step!r} is out of range: this generation ran {n} steps "
                                    f"(valid: {-n}..{n - 1}; 0 is the prefill)")
        return step % n

    def __len__(self) -> int:
        return len(self._histories)

    def __repr__(self) -> str:
        return f"<Steps: {len(self._histories)} ModelHistory>"


class GenerationHistory:
    """A whole generation: one ModelHistory per forward call (a step) and the tokens.

    `gen.steps[k]` is step k's history (0 is the prompt's prefill, k the k-th decoding
    forward); `gen[k, site]` looks a site up in it; `gen.input_ids(k)`, `gen.logits(k)` and
    `gen.token(k)` are what step k read, returned and chose; `gen.stack(site)` joins a
    site's values across the steps. Built once by `torchlog.log_generation` (or
    `torchlog.load_generation`); read-only.

    With beam search (`num_beams` > 1) each step runs on `batch * num_beams` rows, the
    beams of prompt i in rows `gen.beam_rows(i)`; generate reorders the beams between
    steps, so row j of one step need not continue row j of the step before.
    """

    def __init__(self, model_name: str, prompt: torch.Tensor, logged: list[LoggedStep],
                 output: Any = None, sequences: torch.Tensor | None = None, *, num_beams: int = 1,
                 path: str | None = None, failed_step: ModelHistory | None = None) -> None:
        self.model_name = model_name
        self.prompt = prompt  # the prompt's token ids, as given
        self.output = output  # what generate (or the decode loop) returned; None when it raised or loaded
        self.sequences = sequences  # prompt and generated tokens; None when generation raised
        self.num_beams = num_beams  # beams per prompt: rows per prompt in each step's batch
        self.path = path  # the file the steps' values are read from (save_to=); None in memory
        self.failed_step = failed_step  # a loaded partial generation: the log of the step that raised
        self._logged = tuple(logged)
        self._steps = Steps(tuple(step.result for step in logged))
        self.interventions = tuple(StepIntervention(k, record) for k, step in enumerate(logged)
                                   for record in step.result.interventions)

    @property
    def steps(self) -> Steps:
        """The steps axis: `gen.steps[k]` is the ModelHistory of step k."""
        return self._steps

    @property
    def num_steps(self) -> int:
        return len(self._steps)

    @property
    def is_partial(self) -> bool:
        """Whether generation raised before it ended (the steps done are kept)."""
        return self.sequences is None

    @property
    def tokens(self) -> torch.Tensor | None:
        """The generated tokens, one per step (the sequences after the prompt, or after the
        decoder's start token for an encoder-decoder); None when generation raised."""
        start = self._first_new()
        return None if start is None else self.sequences[..., start:]

    def input_ids(self, step: int) -> torch.Tensor | None:
        """The token ids step `step` read (the prompt at the prefill, with a KV cache one
        new token per sequence at each later step); None when forward got no token ids."""
        return self._logged[self._steps.index(step)].input_ids

    def logits(self, step: int) -> torch.Tensor | None:
        """Step `step`'s output logits at the last position, (batch, vocabulary)."""
        return self._logged[self._steps.index(step)].logits

    def token(self, step: int) -> torch.Tensor | None:
        """The token chosen after step `step`, one per sequence; None when generation
        raised or the sequences do not follow the steps one token each. With beam search,
        the token at that place of each returned sequence (the beam it came from is in
        `gen.output.beam_indices` when generate is asked for `return_dict_in_generate=True,
        output_scores=True`); None past the end of the returned sequences."""
        k, start = self._steps.index(step), self._first_new()
        if start is None or start + k >= self.sequences.shape[-1]:
            return None
        if self.num_beams == 1 and self.sequences.shape[0] != _batch(self._logged[k].input_ids):
            return None
        return self.sequences[..., start + k]

    def beam_rows(self, prompt: int) -> range:
        """The rows of each step's batch that hold the beams of prompt `prompt` (0-based):
        generate repeats each prompt `num_beams` times, so `prompt * num_beams` onwards.

        Raises:
            InvalidArgumentTypeError: `prompt` is not an index of the prompts.
        """
        count = int(self.prompt.shape[0])
        if not isinstance(prompt, int) or isinstance(prompt, bool) or not 0 <= prompt < count:
            raise InvalidArgumentTypeError(
                f"beam_rows takes a prompt's index, 0..{count - 1} for this generation's {count} prompt(s), "
                f"got {prompt!r}")
        return range(prompt * self.num_beams, (prompt + 1) * self.num_beams)

    def _first_new(self) -> int | None:
        """Where the generated tokens start in the sequences: each step chose one token, so
        after the prompt (a decoder-only model) or the decoder's start token (T5). Beam
        search may return sequences shorter than its steps: there, after the tokens the
        prefill read."""
        if self.sequences is None:
            return None
        if self.num_beams > 1:
            first = _length(self._logged[0].input_ids) if self._logged else None
            return first if first is not None and first <= self.sequences.shape[-1] else None
        if self.sequences.shape[-1] < self.num_steps:
            return None
        return self.sequences.shape[-1] - self.num_steps

    def __getitem__(self, key: tuple[int, str | int] | int) -> Any:
        """`gen[k, site]`: the pass or layer `site` names in step k; `gen[k]`: step k.

        Raises:
            StepNotFoundError: no step k. LayerNotFoundError: step k has no such site.
            InvalidArgumentTypeError: `key` is neither a step nor a (step, site) pair.
        """
        if isinstance(key, tuple) and len(key) == 2:
            step, site = key
            return self._steps[step][site]
        if isinstance(key, int) and not isinstance(key, bool):
            return self._steps[key]
        raise InvalidArgumentTypeError(
            f"a generation is indexed by a step or a (step, site) pair, as in gen[1, 'transformer.h.0'], "
            f"got {key!r}")

    def steps_with(self, site: str | int) -> list[int]:
        """The steps whose history has `site`."""
        return [k for k, history in enumerate(self._steps) if site in history]

    def stack(self, site: str, dim: int | None = None, steps: Sequence[int] | None = None) -> torch.Tensor:
        """`site`'s saved values at `steps` (all by default), joined along the sequence.

        With a KV cache each decoding step adds one position, so a module's output joins
        into what one forward over the whole sequence would give. `dim` defaults to the
        dimension whose size is each step's number of input tokens, read from every step
        that has the site (so a choice of decoding steps alone joins as the whole would).

        Raises:
            LayerNotFoundError: `site` exists at no chosen step, or names a layer of several
                passes (name one pass, 'label:2'); the message names the steps lacking it.
            StepNotFoundError: a step is out of range.
            InvalidOptionError: a step kept no value for it, or the values cannot be joined;
                or a beam search, whose rows generate reorders between steps.
        """
        if self.num_beams > 1:
            raise InvalidOptionError(
                f"stack({site!r}) cannot join the steps of a beam search (num_beams={self.num_beams}): "
                "generate reorders the beams between steps, so row j of one step need not continue "
                "row j of the step before; read each step with gen[step, site]")
        chosen = [self._steps.index(k) for k in (range(self.num_steps) if steps is None else steps)]
        values = [self._value(k, site) for k in chosen]
        if dim is None:  # read off every step with the site: the prefill tells the sequence apart
            every = [k for k in self.steps_with(site) if self._saved(k, site) is not None]
            shapes = [tuple(self._saved(k, site).shape) for k in every]
            dim = sequence_dim(shapes, [_length(self._logged[k].input_ids) for k in every], site)
        return join_steps(values, dim, site)

    def follow(self, site: str, sequence: int, dim: int | None = None) -> torch.Tensor:
        """`site`'s values along one hypothesis of a beam search: at each step the row of the
        beam that returned sequence `sequence` went through (`beam_path`), joined along the
        sequence as `stack` joins them; so, with a KV cache, what one forward over that
        sequence would give for the tokens the steps read.

        Raises:
            InvalidOptionError: no beam search, or no `beam_indices` (generate with
                return_dict_in_generate=True, output_scores=True); values that cannot join.
            InvalidArgumentTypeError: `sequence` is not a returned sequence's index.
            LayerNotFoundError: as `stack`.
        """
        rows = self.beam_path(sequence)
        values = [self._value(k, site)[row:row + 1] for k, row in enumerate(rows)]
        if dim is None:
            lengths = [_length(self._logged[k].input_ids) for k in range(len(rows))]
            dim = sequence_dim([tuple(v.shape) for v in values], lengths, site)
        return join_steps(values, dim, site)

    def beam_path(self, sequence: int) -> list[int]:
        """The row of each step that returned sequence `sequence` went through (see `follow`)."""
        return beam_path(self.output, sequence, self.num_beams, self.num_steps)

    def _saved(self, step: int, site: str) -> Any:
        value = getattr(self._steps[step][site], "tensor_contents", None)
        return value if isinstance(value, torch.Tensor) else None  # a layer of passes gives a list

    def _value(self, step: int, site: str) -> torch.Tensor:
        history = self._steps[step]
        if site not in history:
            having = self.steps_with(site)
            if not having:
                try:
                    history[site]
                except LayerNotFoundError as missing:
                    raise LayerNotFoundError(f"{site!r} is at no step of this generation; at step "
                                             f"{step}: {missing.args[0]}") from None
            raise LayerNotFoundError(
                f"{site!r} is not at step {step} (it is at steps {having}; the prefill may run other "
                f"ops than the decoding steps); pass steps={having} or name it by module address")
        record = history[site]
        if not hasattr(record, "tensor_contents") or isinstance(record.tensor_contents, list):
            raise LayerNotFoundError(f"{site!r} names a layer of several passes at step {step}; name "
                                     f"one pass, as in '{site}:1'")
        if record.tensor_contents is None:
            raise InvalidOptionError(f"step {step} kept no value for {site!r}; generate with "
                                     f"layers_to_save including {site!r} (or 'all')")
        return torch.as_tensor(record.tensor_contents)

    def summary(self) -> str:
        """A table of the steps: tokens read, token chosen, passes, saved, interventions."""
        beams = f", {self.num_beams} beams per prompt" if self.num_beams > 1 else ""
        rows = [f"GenerationHistory of {self.model_name}: {self.num_steps} steps, prompt "
                f"{tuple(self.prompt.shape)}{beams}" + (" (partial: generation raised)" if self.is_partial else "")]
        if self.path is not None:
            rows.append(f"values in {self.path!r}")
        rows.append(f"{'step':>5}  {'read':>6}  {'chosen':<16} {'passes':>7} {'saved':>6} {'acts':>5}")
        for k, history in enumerate(self._steps):
            token = self.token(k)
            chosen = "-" if token is None else _tokens_text(token)
            rows.append(f"{k:>5}  {_length(self._logged[k].input_ids) or '-':>6}  {chosen:<16} "
                        f"{len(history):>7} {history.num_saved:>6} {len(history.interventions):>5}")
        if self.tokens is not None:
            rows.append(f"generated: {_tokens_text(self.tokens.reshape(-1), limit=24)}")
        return "\n".join(rows)

    def to_pandas(self) -> Any:
        """Each step's `to_pandas()` rows, with a first column `step`.

        Raises:
            MissingDependencyError: pandas is not installed (`pip install torchlog[pandas]`).
        """
        pandas = require("pandas", "GenerationHistory.to_pandas()")
        frames = []
        for k, history in enumerate(self._steps):
            frame = history.to_pandas()
            frame.insert(0, "step", k)
            frames.append(frame)
        return pandas.concat(frames, ignore_index=True)

    def to_html(self, path: str, mode: str | None = None, depth: int | None = None) -> str:
        """Write the generation's viewer (one step's graph under a step control, a site's
        statistics over the steps) to one HTML file; see `torchlog.vis.viewer.to_html`.

        Raises:
            MissingDependencyError: the viewer's extra is not installed.
        """
        from torchlog.vis.viewer import to_html  # lazily: vis depends on torchlog, not back

        return to_html(self, path, mode, depth)

    def show(self, mode: str | None = None, depth: int | None = None, height: int | None = None) -> Any:
        """The generation's viewer inline in a notebook; see `torchlog.vis.viewer.show`."""
        from torchlog.vis.viewer import show

        return show(self, mode, depth, height=height)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        state = ", partial" if self.is_partial else ""
        return f"<GenerationHistory of {self.model_name}: {self.num_steps} steps{state}>"

    def __len__(self) -> int:
        return self.num_steps


def _length(ids: torch.Tensor | None) -> int | None:
    return None if ids is None else int(ids.shape[-1])


def _batch(ids: torch.Tensor | None) -> int | None:
    return None if ids is None or ids.dim() < 2 else int(ids.shape[0])


def _tokens_text(tokens: torch.Tensor, limit: int = 4) -> str:
    values = tokens.reshape(-1).tolist()
    return " ".join(str(v) for v in values[:limit]) + (" ..." if len(values) > limit else "")
