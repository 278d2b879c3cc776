"""The viewer of a generation: one step's graph page at a time, a step control, a site over the steps.

The page is a frame around the ordinary viewer page of one step (`page_html` of
`gen.steps[k]`), with a step control (select, previous, next; the URL hash keeps
`#step=k&site=...`), each step's tokens read and chosen, and a panel plotting a site's
statistics over the steps with the chart a rolled layer's panel draws over its passes.

Written to a file, the page holds the viewer page's scripts once and each step's page data,
up to EMBED_LIMIT_BYTES of step data in all; a longer generation is served instead
(`generation_server.serve_generation`), which builds each step's page when it is opened.
"""
from __future__ import annotations

from collections.abc import Callable
from string import Template
from typing import TYPE_CHECKING, Any

import torch

from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError, TorchlogError
from torchlog.vis.options import check_depth
from torchlog.vis.viewer.page import (
    ViewerPage, ascii_html, asset_text, check_mode, fill_page, page_json, script_json, script_of,
)
from torchlog.vis.viewer.step_sites import check_site, site_keys, site_table

if TYPE_CHECKING:
    from torchlog.generation import GenerationHistory

__all__ = ["EMBED_LIMIT_BYTES", "check_generation", "generation_html", "is_generation", "step_data_json",
           "step_entries"]

# Step page data a written page holds at most (a tiny GPT-2's step: about 150 KB).
EMBED_LIMIT_BYTES = 16_000_000
MAX_TOKENS_SHOWN = 64  # per sequence, in the token line
MAX_SEQUENCES_SHOWN = 8
# Where a step's data goes in the viewer page the frame shows; the page's scripts hold no such text.
STEP_MARK = "\"torchlog-step-data\""
SHELL_PARTS = ("steps.js", "panel.js", "charts.js")


def is_generation(value: Any) -> bool:
    """Whether `value` is a GenerationHistory (torchlog.generation is imported only here)."""
    from torchlog.generation import GenerationHistory  # vis reads histories; imported late like the API

    return isinstance(value, GenerationHistory)


def check_generation(gen: Any) -> "GenerationHistory":
    """`gen` when it is a GenerationHistory with at least one step.

    Raises:
        InvalidArgumentTypeError: `gen` is not a GenerationHistory.
        TorchlogError: it has no steps.
    """
    if not is_generation(gen):
        raise InvalidArgumentTypeError(
            f"the generation viewer needs a torchlog GenerationHistory, got {type(gen).__name__}; "
            "use torchlog.log_generation(model, input_ids, ...)")
    if gen.num_steps == 0:
        raise TorchlogError(
            f"{gen!r} holds no steps, so there is nothing to show; check that generation called the "
            "model's forward at least once (a decode loop must call the model)")
    return gen


def check_step(gen: "GenerationHistory", step: Any) -> int:
    """`step` as a position from the start (negative counts from the end).

    Raises:
        StepNotFoundError: out of range (the message gives the range).
        InvalidArgumentTypeError: not an int.
    """
    return gen.steps.index(step)


def _check_token_text(token_text: Any) -> None:
    if token_text is not None and not callable(token_text):
        raise InvalidArgumentTypeError(
            f"token_text must be a function of a list of token ids returning text (a tokenizer's "
            f"decode), or None, got {token_text!r:.80} of type {type(token_text).__name__}")


def _rows(ids: torch.Tensor | None) -> list[list[int]] | None:
    """Token ids as one list per sequence (a 1-d tensor is one sequence)."""
    if ids is None:
        return None
    rows = ids.reshape(1, -1) if ids.dim() < 2 else ids.reshape(ids.shape[0], -1)
    return [row.tolist() for row in rows]


def _shown(rows: list[list[int]] | None, token_text: Callable[[list[int]], str] | None) -> dict[str, Any] | None:
    """The ids the token line shows (at most MAX_TOKENS_SHOWN a sequence, the last ones), what
    was left out, and their text when `token_text` is given."""
    if rows is None:
        return None
    kept = [row[-MAX_TOKENS_SHOWN:] for row in rows[:MAX_SEQUENCES_SHOWN]]
    entry: dict[str, Any] = {"ids": kept, "length": len(rows[0]) if rows else 0, "sequences": len(rows)}
    if token_text is not None:
        texts = []
        for row in kept:
            text = token_text(row)
            if not isinstance(text, str):
                raise InvalidArgumentTypeError(
                    f"token_text({row!r:.60}) returned {text!r:.60} of type {type(text).__name__}; "
                    "it must return a str")
            texts.append(text)
        entry["text"] = texts
    return entry


def step_entries(gen: "GenerationHistory",
                 token_text: Callable[[list[int]], str] | None = None) -> list[dict[str, Any]]:
    """What the step control shows of each step: its tokens read and chosen, its size.

    Example:
        >>> import torch, torchlog
        >>> class Next(torch.nn.Module):
        ...     def forward(self, ids):
        ...         return torch.nn.functional.one_hot((ids + 1) % 5, 5).float()
        >>> def loop(model, ids):
        ...     for _ in range(2):
        ...         ids = torch.cat([ids, model(ids)[:, -1:].argmax(-1)], dim=-1)
        ...     return ids
        >>> gen = torchlog.log_generation(Next(), torch.tensor([[1, 2]]), decode=loop)
        >>> [(s['name'], s['read']['ids'], s['chosen']['ids']) for s in step_entries(gen)]
        [('prefill', [[1, 2]], [[3]]), ('step 1', [[1, 2, 3]], [[4]])]
    """
    _check_token_text(token_text)
    entries = []
    for k, history in enumerate(gen.steps):
        entries.append({
            "step": k, "name": "prefill" if k == 0 else f"step {k}",
            "read": _shown(_rows(gen.input_ids(k)), token_text),
            "chosen": _shown(_rows(gen.token(k)), token_text),
            "passes": len(history), "saved": history.num_saved,
        })
    return entries


def step_data_json(gen: "GenerationHistory", step: int, mode: str | None, depth: int | None) -> str:
    """The page data of step `step`'s viewer page, as `page_html` holds it (JSON).

    Raises:
        StepNotFoundError: no such step. TorchlogError: the step holds no ops.
    """
    return page_json(gen.steps[step], mode, depth)


def _frame_template(title: str) -> str:
    """The viewer page with STEP_MARK where its data goes."""
    page = str(fill_page(title, STEP_MARK))
    if page.count(STEP_MARK) != 1:
        raise RuntimeError(f"the viewer page's scripts hold {STEP_MARK!r}; choose another mark in generation.py")
    return page


def _embedded_steps(gen: "GenerationHistory", mode: str | None, depth: int | None) -> str:
    """Each step's page data in a script element of its own, refused past EMBED_LIMIT_BYTES."""
    parts, size = [], 0
    for k in range(gen.num_steps):
        text = step_data_json(gen, k, mode, depth)
        size += len(text)
        if size > EMBED_LIMIT_BYTES:
            raise InvalidOptionError(
                f"the page data of steps 0-{k} of this generation already takes {size / 1e6:.1f} MB, over "
                f"the {EMBED_LIMIT_BYTES / 1e6:.3g} MB one page holds; serve it instead, which builds "
                "each step's page when it is opened: torchlog.vis.viewer.serve_generation(gen)")
        parts.append(f'<script id="torchlog-step-{k}" type="application/json">{text}</script>')
    template = script_json(_frame_template(gen.model_name))
    parts.append(f'<script id="torchlog-step-page" type="application/json">{template}</script>')
    return "\n".join(parts)


def generation_html(gen: "GenerationHistory", step: int = 0, site: str | None = None,
                    mode: str | None = None, depth: int | None = None,
                    token_text: Callable[[list[int]], str] | None = None, *,
                    served: bool = False) -> ViewerPage:
    """The viewer of `gen` as one HTML page: step `step`'s graph, a step control, and `site`'s
    statistics over the steps (None: the reader picks a site, or clicks a node).

    `mode` and `depth` set each step page's opening view (None picks a readable one, step by
    step); `token_text` (a tokenizer's `decode`) turns each step's token ids into text. With
    `served`, the page holds no step data: a `serve_generation` server hands it each step's
    page and each site's figures when asked.

    Raises:
        InvalidArgumentTypeError: `gen` is not a GenerationHistory, or a bad `token_text`,
            `site` or `depth`.
        TorchlogError: the generation has no steps.
        StepNotFoundError: `step` is out of range.
        LayerNotFoundError: `site` is at no step.
        InvalidOptionError: a bad `mode` or `depth`, or the steps' page data is over
            EMBED_LIMIT_BYTES (serve the generation instead).
    """
    check_generation(gen)
    start = check_step(gen, step)
    check_mode(mode)
    check_depth(depth, "depth", "a readable default")
    if site is not None:
        check_site(gen, site)
    keys = site_keys(gen)
    data: dict[str, Any] = {"model": gen.model_name, "steps": step_entries(gen, token_text), "start": start,
                            "site": site, "sites": keys, "served": served, "partial": gen.is_partial}
    steps = ""
    if not served:
        data["where"], data["stats"] = site_table(gen, keys)
        steps = _embedded_steps(gen, mode, depth)
    page = Template(asset_text("generation.html")).substitute(
        title=ascii_html(gen.model_name), style=asset_text("viewer.css"), data=script_json(data),
        steps=steps, script=script_of(SHELL_PARTS))
    return ViewerPage(page)
