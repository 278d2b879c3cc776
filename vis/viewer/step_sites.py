"""A site's statistics at each step of a generation: what the viewer plots over the steps.

A site is any key a step's history takes (a module address, a label, `label:pass`), looked up
in each step on its own, as `gen[k, site]` does. The figures are the page's own per-pass
statistics (`stats.tensor_stats_all`: min, max, mean, std, zeros, NaN, Inf), so the chart over
the steps shows what each step's panel shows for that pass.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torchlog.errors import InvalidArgumentTypeError, LayerNotFoundError
from torchlog.records import PassRecord
from torchlog.vis.viewer.stats import tensor_stats_all

if TYPE_CHECKING:
    from torchlog.generation import GenerationHistory
    from torchlog.history import ModelHistory

__all__ = ["check_site", "site_keys", "site_series", "site_table"]

# The figures a point of the chart carries (the histogram and heatmap stay in the step's page).
SERIES_FIELDS = ("numel", "nan", "inf", "zeros", "min", "max", "mean", "std", "masked")
ABSENT = "not at this step"


def site_keys(gen: "GenerationHistory") -> list[str]:
    """Every site found at some step, module addresses first, then labels, in step order."""
    addresses: dict[str, None] = {}
    labels: dict[str, None] = {}
    for history in gen.steps:
        addresses.update((address, None) for address in history.modules if address and address in history)
        labels.update((record.label, None) for record in history)
    return [*addresses, *(label for label in labels if label not in addresses)]


def check_site(gen: "GenerationHistory", site: Any) -> str:
    """`site` when some step has it.

    Raises:
        LayerNotFoundError: no step has it; the message is the last step's lookup error
            (the key forms and the closest labels).
        InvalidArgumentTypeError: `site` is not a str.
    """
    if not isinstance(site, str):
        raise InvalidArgumentTypeError(
            f"site must be a str (a module address or a label, as in gen[k, site]), got {site!r} "
            f"of type {type(site).__name__}")
    if any(site in history for history in gen.steps):
        return site
    try:
        gen.steps[-1][site]
    except LayerNotFoundError as missing:
        raise LayerNotFoundError(f"site {site!r} is at no step of this generation; at the last "
                                 f"step: {missing.args[0]}") from None
    raise LayerNotFoundError(f"site {site!r} is at no step of this generation")


def _resolve(history: "ModelHistory", site: str) -> tuple[str | None, PassRecord | str]:
    """The label `site` names in one step and its pass, or why it has no figures there."""
    if site not in history:
        return None, ABSENT
    found = history[site]
    if not isinstance(found, PassRecord):
        return found.label, f"a layer of {len(found)} passes at this step: name one, as in '{found.label}:1'"
    return found.label, found if found.saved is not None else "not saved"


def site_table(gen: "GenerationHistory", sites: Sequence[str]) -> tuple[dict[str, list[str | None]],
                                                                        list[dict[str, Any]]]:
    """Where each site is at each step and the statistics of what it names there.

    Returns `(where, stats)`: `where[site][k]` is the label `site` names at step k (None where
    it names nothing); `stats[k][label]` the figures of that pass's saved value, or a str
    saying why there are none ('not saved'). Each step's values are summarised together.
    """
    where: dict[str, list[str | None]] = {site: [] for site in sites}
    stats: list[dict[str, Any]] = []
    for history in gen.steps:
        found: dict[str, PassRecord | str] = {}
        for site in sites:
            label, record = _resolve(history, site)
            where[site].append(label)
            if label is not None:
                found.setdefault(label, record)
        records = [r for r in found.values() if isinstance(r, PassRecord)]
        figures = tensor_stats_all([r.tensor_contents for r in records])
        step: dict[str, Any] = {label: why for label, why in found.items() if isinstance(why, str)}
        for record, figure in zip(records, figures):
            step[record.label] = "not a tensor" if figure is None else \
                {key: figure[key] for key in SERIES_FIELDS if key in figure}
        stats.append(step)
    return where, stats


def site_series(gen: "GenerationHistory", site: str) -> dict[str, Any]:
    """`site` over the steps: `{'site', 'labels', 'stats'}`, one entry per step: the pass it
    names (None where none), and its figures or a str saying why there are none.

    Raises:
        LayerNotFoundError, InvalidArgumentTypeError: as `check_site`.

    Example:
        >>> import torch, torchlog
        >>> class Next(torch.nn.Module):
        ...     def forward(self, ids):
        ...         return torch.nn.functional.one_hot((ids + 1) % 5, 5).float()
        >>> def loop(model, ids):
        ...     for _ in range(2):
        ...         ids = torch.cat([ids, model(ids)[:, -1:].argmax(-1)], dim=-1)
        ...     return ids
        >>> gen = torchlog.log_generation(Next(), torch.tensor([[1]]), decode=loop)
        >>> series = site_series(gen, 'onehot_1_3')
        >>> series['labels'], [s['max'] for s in series['stats']]
        (['onehot_1_3', 'onehot_1_3'], [1.0, 1.0])
    """
    check_site(gen, site)
    where, stats = site_table(gen, [site])
    labels = where[site]
    points = [ABSENT if label is None else stats[k][label] for k, label in enumerate(labels)]
    return {"site": site, "labels": labels, "stats": points}
