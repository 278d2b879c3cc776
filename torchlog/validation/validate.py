"""Replay validation: check a logged pass by re-running each op on its parents' saved values."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

# The plain run spreads input_args and puts the model's buffers back as logging does.
from torchlog.api import log_forward_pass
from torchlog.arguments import positional_args
from torchlog.capture import find_tensors
from torchlog.model_state import model_kept
from torchlog.records import PassRecord
from torchlog.rerun import is_continuous, rerun, value_mismatch
from torchlog.seeding import new_seed, seeded
from torchlog.validation.perturbation import largest_finite, perturbed
from torchlog.validation.report import ReplayProblem, ReplayReport, print_report
from torchlog.validation.rules import READS_EVERY_VALUE, UNDEFINED_VALUES, ignores_parent_values, may_perturb

__all__ = ["find_replay_problems", "validate_saved_activations"]

_NUM_TRIES = 3  # fresh perturbations tried before concluding an output ignores a parent


def validate_saved_activations(model: nn.Module, input_args: Any,
                               input_kwargs: dict[str, Any] | None = None,
                               random_seed: int | None = None, verbose: bool = False,
                               return_report: bool = False) -> bool | ReplayReport:
    """Log `model` and check every saved activation by replaying the op that made it.

    The model runs twice with the same seed: once plainly and once logged with every
    activation, function argument and RNG state saved. The buffers are put back after
    each run and each run gets its own copy of the inputs, so both start from one state.

    Args:
        model: the module to check; left as it was.
        input_args: as for `log_forward_pass`.
        input_kwargs: as for `log_forward_pass`.
        random_seed: seed of both runs (random when None).
        verbose: print each failed check (pass, check, max difference), each
            inconclusive edge, and a summary.
        return_report: return the ReplayReport (problems with the op and why,
            inconclusive edges, counts) instead of a bool.

    Returns:
        True when the outputs match the plain run, every op replays to its saved value
        and no parent it lists is shown to be ignored; False otherwise. A model that
        cannot be replayed (its logged run raises where the plain run did not, a check
        cannot run) gives False and a problem naming the op and why, never an exception.

    Raises:
        TorchlogError: the errors of `log_forward_pass` for bad arguments.
        Exception: whatever the model raises on the plain run.

    Random ops are replayed with the CPU RNG state recorded before them; random ops on
    CUDA tensors are not reproduced yet and fail the replay check.

    Example:
        >>> import torch, torchlog
        >>> _ = torch.manual_seed(0)
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
        >>> torchlog.validate_saved_activations(net, torch.randn(2, 3))
        True
    """
    seed = new_seed() if random_seed is None else random_seed
    input_kwargs = {} if input_kwargs is None else input_kwargs
    args, kwargs = _fresh((positional_args(model, input_args), input_kwargs))
    with seeded(seed), model_kept(list(model.named_modules())):
        expected = model(*args, **kwargs)
    report = _logged_report(model, _fresh((input_args, input_kwargs)), seed, expected)
    if verbose:
        print_report(report)
    return report if return_report else report.passed


def _logged_report(model: nn.Module, inputs: tuple, seed: int, expected: Any) -> ReplayReport:
    """Log the second run and check it; a run or check that raises becomes a problem."""
    try:
        history = log_forward_pass(model, *inputs, random_seed=seed, save_function_args=True,
                                   detach_saved_tensors=True)
    except Exception as exc:  # the model ran plainly: it cannot be run again the same way
        where = getattr(getattr(exc, "torchlog_history", None), "info", None)
        detail = where.failure if where is not None else f"{type(exc).__name__}: {exc}"
        return ReplayReport([ReplayProblem(
            "model", "run", f"the logged run raised where the plain run did not ({detail}); "
            "a model with side effects or state that changes per call cannot be replayed")])
    problems = _compare_outputs(history.passes, expected)
    report = find_replay_problems(history)
    report.problems[:0] = problems
    return report


def find_replay_problems(history: Any, check_perturbation: bool = True) -> ReplayReport:
    """Replay every op of `history` that kept its function arguments and check it.

    Two questions per op. Replay: does the op, re-run on its parents' saved values (in
    place of the tensors it really received) and with its recorded RNG state, give back
    its own saved value? A wrong saved value or a wrong parent link fails here. Perturb:
    does the op's output move when one parent's values are replaced by others? An
    elementwise arithmetic op whose output stays put fails here (it must read every
    value); for other ops the edge is inconclusive (a zero weight, a change lost to
    rounding), as is a parent not perturbed because its integer values may be sizes or
    indexes, or an output NaN or infinite in every element (NaN + v is NaN whatever v
    is); an output NaN only in places must still move where it is finite.
    `rules.ignores_parent_values` lists the outputs that legitimately do not depend on a
    parent's values.

    `history` must be logged with `save_function_args=True` and its activations saved;
    ops without them are counted as skipped. The history is not changed.

    Returns:
        A report listing each failed replay or perturbation check and each inconclusive edge.
    """
    passes = history.passes
    values = {p.label: p.tensor_contents for p in passes}
    calls = _outputs_by_call(passes, values)
    perturbed_calls: set = set()
    report = ReplayReport([])
    for record in passes:
        if not _replayable(record, values):
            report.num_skipped += not _is_source_or_output(record)
            continue
        problem = _check_replay(record, values)
        report.num_replayed += 1
        call = _call_key(record)
        if problem is None and check_perturbation and call not in perturbed_calls:
            perturbed_calls.add(call)  # all outputs of one call share parents: check once
            try:
                problem = _check_parents(record, values, calls[call], report)
            except Exception as exc:  # a rule that cannot read this op: say so, go on
                report.inconclusive.append(ReplayProblem(
                    record.label, "perturb", f"could not be checked: {type(exc).__name__}: {exc}"))
        if problem is not None:
            report.problems.append(problem)
    return report


def _call_key(record: PassRecord) -> tuple[int, int]:
    # The outputs of one call of a multi-output op share its argument tuple and dict.
    _, args, kwargs = record.func_args
    return id(args), id(kwargs)


def _outputs_by_call(passes: list[PassRecord], values: dict[str, Any]) -> dict:
    """Per call: {output_index: saved value} of every output the call returned."""
    calls: dict[tuple[int, int], dict[int, Any]] = {}
    for record in passes:
        if record.func_args is not None and not _is_alias_write(record):
            calls.setdefault(_call_key(record), {})[record.output_index] = values[record.label]
    return calls


def _is_alias_write(record: PassRecord) -> bool:
    """A tensor changed through another view of its storage, recorded by capture as one
    more output of the op that wrote the view. Its value is the whole tensor after the
    write, which re-running the op cannot give: it is not replayed, its readers are."""
    return "view_written_by" in record.extra


def _is_source_or_output(record: PassRecord) -> bool:
    return record.is_input or record.is_output or record.is_buffer or record.is_source


# ----- preparing the two runs ------------------------------------------------------------------
def _fresh(value: Any, clones: dict[int, torch.Tensor] | None = None) -> Any:
    """A copy of nested inputs with every tensor cloned, so no run sees another's mutations.

    A tensor passed twice is cloned once: models test `query is key` (MultiheadAttention).
    """
    clones = {} if clones is None else clones
    if isinstance(value, torch.Tensor):
        if id(value) not in clones:
            clones[id(value)] = value.detach().clone().requires_grad_(value.requires_grad)
        return clones[id(value)]
    if isinstance(value, list):
        return [_fresh(v, clones) for v in value]
    if type(value) is tuple:
        return tuple(_fresh(v, clones) for v in value)
    if type(value) is dict:
        return {k: _fresh(v, clones) for k, v in value.items()}
    return value


def _compare_outputs(passes: list[PassRecord], expected: Any) -> list[ReplayProblem]:
    outputs = [p for p in passes if p.is_output]
    wanted = [t for t, _ in find_tensors(expected)]
    if len(outputs) != len(wanted):
        return [ReplayProblem("outputs", "outputs",
                              f"the log has {len(outputs)} output tensors, a plain forward "
                              f"pass returned {len(wanted)}")]
    problems = []
    for record, tensor in zip(outputs, wanted):
        mismatch = value_mismatch(record.tensor_contents, tensor.detach())
        if mismatch is not None:
            problems.append(ReplayProblem(
                record.label, "outputs",
                f"saved output differs from a plain forward pass with the same seed: {mismatch[0]}",
                mismatch[1]))
    return problems


# ----- replay --------------------------------------------------------------------------------
def _replayable(record: PassRecord, values: dict[str, Any]) -> bool:
    if record.func_args is None or record.func_name in UNDEFINED_VALUES or _is_alias_write(record):
        return False
    if record.func_args[0] is torch.autograd.grad:  # needs the autograd graph, not saved values
        return False
    if not isinstance(values.get(record.label), torch.Tensor):
        return False
    return all(isinstance(values.get(edge.label), torch.Tensor) for edge in record.parents)


def _check_replay(record: PassRecord, values: dict[str, Any]) -> ReplayProblem | None:
    try:
        outputs = rerun(record, values)
    except Exception as exc:  # the op itself failed on its saved inputs: report, go on
        return ReplayProblem(record.label, "replay",
                             f"re-running {record.func_name!r} on the saved parents raised "
                             f"{type(exc).__name__}: {exc}")
    if record.output_index >= len(outputs):
        return ReplayProblem(record.label, "replay",
                             f"re-running {record.func_name!r} gave {len(outputs)} tensors, "
                             f"but this pass is output {record.output_index}")
    mismatch = value_mismatch(values[record.label], outputs[record.output_index])
    if mismatch is None:
        return None
    parents = ", ".join(record.parent_labels) or "no parents"
    return ReplayProblem(record.label, "replay",
                         f"{record.func_name!r} re-run on the saved values of ({parents}) does "
                         f"not give the saved activation: {mismatch[0]}", mismatch[1])


# ----- perturbation --------------------------------------------------------------------------
def _check_parents(record: PassRecord, values: dict[str, Any], outputs: dict[int, Any],
                   report: ReplayReport) -> ReplayProblem | None:
    """Check that each parent moves some output of the call (`outputs`: index -> saved).

    An unmoved output fails only for elementwise arithmetic, which reads every value, and
    only where some output element is finite; for other ops (a zero weight, a change lost
    to rounding) and outputs NaN or infinite throughout, the edge is inconclusive.
    """
    generator = torch.Generator().manual_seed(record.op_index)
    baseline = rerun(record, values)  # exact reference: replay matched the saved values
    scale = max((largest_finite(t) for t in baseline), default=0.0)
    can_show = _finite_somewhere(baseline, outputs)
    for label in dict.fromkeys(record.parent_labels):
        if ignores_parent_values(record, label, values, list(outputs.values())):
            continue
        if not may_perturb(record, values[label]):
            report.inconclusive.append(ReplayProblem(
                record.label, "perturb", f"parent {label!r} holds {values[label].dtype} values "
                "that may be sizes or indexes: not perturbed"))
            continue
        outcome = _moves_output(record, values, label, baseline, outputs, (generator, scale))
        if outcome is False and can_show and record.func_name in READS_EVERY_VALUE:
            return ReplayProblem(record.label, "perturb",
                                 f"{record.func_name!r} gave the same output with other values "
                                 f"in parent {label!r}: it does not seem to read that parent")
        if outcome is not True:
            why = "no perturbation of it could be run" if outcome is None else \
                "other values in it did not move the output" if can_show else \
                "the output is NaN or infinite in every element, so no values of the parent can move it"
            report.inconclusive.append(ReplayProblem(record.label, "perturb", f"parent {label!r}: {why}"))
        report.num_perturbed += outcome is True
    return None


def _finite_somewhere(baseline: list, outputs: dict[int, Any]) -> bool:
    """Whether some output of the call has a finite element in the unperturbed re-run.

    Only a finite element can show that an op reads a parent: NaN + v is NaN and
    inf + v is inf for every v. In elementwise arithmetic every parent feeds every output
    element (broadcasting included), so one finite element that stays put is a failure,
    while an output that is NaN or infinite throughout leaves the edge inconclusive.
    """
    return any(i < len(baseline) and bool(torch.isfinite(baseline[i]).any()) for i in outputs)


def _moves_output(record: PassRecord, values: dict[str, Any], label: str, baseline: list,
                  outputs: dict[int, Any], draw: tuple[torch.Generator, float]) -> bool | None:
    """True if some perturbation of `label` changes an output (any element, exactly, against
    an unperturbed re-run), False if none does, None when no perturbation could be made or
    run (the op rejects other values: indexes)."""
    tried = False
    for _ in range(_NUM_TRIES):
        other = perturbed(values[label], *draw)
        if other is None:
            break
        try:
            result = rerun(record, values, (label, other))
        except Exception:  # e.g. an index out of range: this draw says nothing
            continue
        tried = True
        if any(i < len(result) and i < len(baseline) and _differs(baseline[i], result[i])
               for i in outputs):
            return True
    return False if tried else None


def _differs(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether any element differs at all (NaN equals NaN): a change far under the replay
    tolerance still shows that the output reads the parent (`x + 1e-6 * f(x)`)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return True
    b = b.to(a.device)
    if is_continuous(a):
        return bool(((a != b) & ~(torch.isnan(a) & torch.isnan(b))).any())
    return not torch.equal(a, b)
