"""The entry point: `compare(a, b)`, from two histories to a Comparison, reading values pair by pair."""
from __future__ import annotations

from typing import Any

from torchlog.comparison.alignment import Pair, align
from torchlog.comparison.differences import SAME
from torchlog.comparison.held_values import HeldValues
from torchlog.comparison.local_error import LocalErrors
from torchlog.comparison.origins import find_origins
from torchlog.comparison.result import Comparison
from torchlog.comparison.rows import Row, Status
from torchlog.comparison.statuses import judge, random_draws
from torchlog.comparison.tolerances import Tolerance, check_tolerance, default_tolerance, working_precision
from torchlog.errors import ComparisonError, InvalidArgumentTypeError
from torchlog.history import ModelHistory
from torchlog.records import PassRecord

__all__ = ["compare"]

_COMPARED = (Status.MATCH, Status.DIFFERS)  # rows whose op is re-run for its local error


def compare(a: ModelHistory, b: ModelHistory, *, rtol: float | None = None,
            atol: float | None = None) -> Comparison:
    """Compare two logged runs op by op: where they part, and the error each op adds.

    The passes pair by label when both runs ran the same ops, else in execution order
    (see `torchlog.comparison.alignment`). Each pair's values are read, compared and let go
    before the next pair's, so histories opened with `torchlog.load` stay on disk. When
    `b` kept its function arguments (`save_function_args=True`), each compared row also
    gets its local error: b's op re-run on a's parent values.

    Args:
        a: the reference history, in memory or opened with `torchlog.load`; rows follow
            a's execution order and differences are taken relative to a.
        b: the history compared with it, in memory or opened with `torchlog.load`.
        rtol: two values match when max |a - b| <= atol + rtol * max |a|. None
            (default) takes each pair's from the coarsest precision the values were
            worked out at (their dtypes and those of every value they came from):
            float64 1e-10 / 1e-12, float32 1e-5 / 1e-7, float16 and bfloat16 1e-2 / 1e-4.
        atol: the absolute part of that test; None as for `rtol`.
            Integer and bool values must be equal.

    Returns:
        The Comparison: `rows`, `first_divergence`, `origins`, `print()`, `to_pandas()`.

    Raises:
        InvalidArgumentTypeError: `a` or `b` is not a ModelHistory.
        InvalidOptionError: a tolerance is negative, not finite or not a number.
        ComparisonError: a history saved no values (`layers_to_save=None`), or the two
            runs share no op to pair.

    Example:
        >>> import torch, torchlog
        >>> _ = torch.manual_seed(0)
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh())  # no unit is cut off
        >>> x = torch.randn(2, 3)
        >>> a = torchlog.log_forward_pass(net, x)
        >>> with torch.no_grad():
        ...     net[0].bias[1] += 0.5
        >>> b = torchlog.log_forward_pass(net, x)
        >>> comparison = torchlog.compare(a, b)
        >>> comparison.counts["match"], comparison.first_divergence.label_a
        (1, 'linear_1_1')
    """
    for name, history in (("a", a), ("b", b)):
        _check_history(name, history)
    given = (check_tolerance("rtol", rtol), check_tolerance("atol", atol))
    pairs, alignment = align(a.passes, b.passes)
    if not any(x is not None and y is not None for x, y in pairs):
        raise ComparisonError(
            f"runs a ({a.model_name}, {len(a)} passes) and b ({b.model_name}, {len(b)} passes) "
            "share no op: no pass of one has the label and function, or the module, function "
            "and output shape, of a pass of the other; compare two runs of the same model or of "
            "a port of it")
    local = LocalErrors(pairs)
    rows = _rows(pairs, (a, b), given, local)
    parents = [{p.label: p.parent_labels for p in h} for h in (a, b)]
    return Comparison(a, b, rows, find_origins(rows, *parents), alignment, local.failures)


def _check_history(name: str, history: Any) -> None:
    if not isinstance(history, ModelHistory):
        raise InvalidArgumentTypeError(
            f"compare() takes two ModelHistory objects (from torchlog.log_forward_pass or "
            f"torchlog.load); {name} is {history!r} of type {type(history).__name__}")
    if not any(record.saved is not None for record in history):
        raise ComparisonError(
            f"history {name} ({history!r}) saved no values (logged with layers_to_save=None), "
            "so there is nothing to compare; log it with layers_to_save='all' (the default)")


def _rows(pairs: list[Pair], runs: tuple[ModelHistory, ModelHistory],
          given: tuple[float | None, float | None], local: LocalErrors) -> list[Row]:
    """One row per pair, values read pair by pair (run a's held while a re-run needs them)."""
    a, b = runs
    precision = [working_precision(h) for h in runs]
    drew = [random_draws(h) for h in runs] if a.random_seed != b.random_seed else [set(), set()]
    held = HeldValues(local.last_use(pairs))
    status_of: dict[str, Status] = {}
    rows = []
    for index, (x, y) in enumerate(pairs):
        held.next_row(index)
        if x is None or y is None:
            rows.append(_unpaired(index, x, y))
            continue
        tolerance = _tolerance(x, y, precision[0][x.label], precision[1][y.label], given)
        drawn = (x.label in drew[0] or y.label in drew[1]) and all(
            status_of.get(label, Status.MATCH) == Status.MATCH for label in x.parent_labels)
        status, diff, reference = judge(x, y, tolerance, drawn)
        if reference is not None:
            held.keep(x, reference.value)
            local.note_peak(x, reference.peak)
        if diff == SAME:
            local.note_exact(y)
        error = local.of(x, y, reference, held, diff) if status in _COMPARED else None
        del reference  # the pair's values go before the next pair's are read
        status_of[x.label] = status
        rows.append(Row(index, x.label, y.label, x.func_name, x.module, x.call_site, y.call_site,
                        x.shape, y.shape, x.dtype, y.dtype, status, tolerance, diff, error))
    return rows


def _tolerance(x: PassRecord, y: PassRecord, precision_a: float, precision_b: float,
               given: tuple[float | None, float | None]) -> Tolerance:
    if not any(d.is_floating_point or d.is_complex for d in (x.dtype, y.dtype)):
        return Tolerance(0.0, 0.0)  # indexes, masks, counts: equal or not
    default = default_tolerance(max(precision_a, precision_b))
    rtol, atol = given
    return Tolerance(default.rtol if rtol is None else rtol, default.atol if atol is None else atol)


def _unpaired(index: int, x: PassRecord | None, y: PassRecord | None) -> Row:
    record = x if x is not None else y
    assert record is not None
    return Row(index, None if x is None else x.label, None if y is None else y.label,
               record.func_name, record.module, record.call_site, None if y is None else y.call_site,
               None if x is None else x.shape, None if y is None else y.shape,
               None if x is None else x.dtype, None if y is None else y.dtype,
               Status.ONLY_A if y is None else Status.ONLY_B, Tolerance(0.0, 0.0))
