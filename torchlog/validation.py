"""Checking a logged pass by replaying every op from the saved activations of its parents.

`validate_saved_activations` logs a model with everything saved and then asks three
questions of the log:

1. outputs: do the saved outputs equal those of a plain forward pass with the same seed?
2. replay: does each op, re-run on its parents' saved values (in place of the tensors it
   really received) and with its recorded RNG state, give back its own saved value? A
   wrong saved value or a wrong parent link fails here.
3. perturb: does the op's output move when one parent's values are replaced by others?
   A parent link to a tensor the op never read fails here. Some outputs legitimately do
   not depend on a parent's values; `_ignores_parent_values` lists them.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

# The plain run spreads input_args and puts the model's buffers back as logging does.
from torchlog.api import log_forward_pass
from torchlog.arguments import positional_args
from torchlog.model_state import model_kept
from torchlog.capture.nesting import find_tensors
from torchlog.records import PassRecord
from torchlog.seeding import new_seed, seeded

_SETITEM = torch.Tensor.__setitem__
_NUM_TRIES = 3  # fresh perturbations tried before concluding an output ignores a parent

# Outputs made from their tensor argument's shape, dtype and device only.
_SHAPE_ONLY = frozenset({
    "zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like",
    "randint_like", "new_zeros", "new_ones", "new_empty", "new_full", "_shape_as_tensor",
})
# Ops that use their second argument (`other`) only for its shape or dtype.
_SHAPE_OF_OTHER = frozenset({"type_as", "expand_as", "view_as", "reshape_as", "to"})
# In-place ops that overwrite every element of their first argument.
_OVERWRITES_FIRST = frozenset({
    "copy_", "fill_", "zero_", "normal_", "uniform_", "random_", "exponential_",
    "geometric_", "cauchy_", "log_normal_", "bernoulli_",
})
# Norms taking (input, running_mean, running_var, weight, bias, use_batch_stats, ...).
_NORMS = frozenset({"batch_norm", "instance_norm"})
# Ops whose values are undefined (uninitialised memory): nothing to replay.
_UNDEFINED_VALUES = frozenset({"empty", "empty_like", "new_empty", "empty_strided"})


@dataclass(frozen=True, slots=True)
class ReplayProblem:
    """One failed check: which pass, which check, and how far off it was."""

    label: str  # the pass that failed, e.g. 'relu_1_2' or 'linear_1_1:3'
    check: str  # 'outputs', 'replay', 'perturb'
    detail: str  # what went wrong, in words
    max_diff: float | None = None  # largest absolute difference, where values were compared

    def __str__(self) -> str:
        diff = "" if self.max_diff is None else f" (max difference {self.max_diff:.3g})"
        return f"{self.label}: {self.check} check failed: {self.detail}{diff}"


@dataclass(slots=True)
class ReplayReport:
    """What a replay checked and what it found."""

    problems: list[ReplayProblem]
    num_replayed: int = 0  # ops re-run from their parents
    num_perturbed: int = 0  # (op, parent) pairs whose dependence was confirmed
    num_skipped: int = 0  # ops with no saved function or parent values to replay from


def validate_saved_activations(model: nn.Module, input_args: Any,
                               input_kwargs: dict[str, Any] | None = None,
                               random_seed: int | None = None, verbose: bool = False) -> bool:
    """Log `model` and check every saved activation by replaying the op that made it.

    The model runs twice with the same seed: once plainly and once logged with every
    activation, function argument and RNG state saved. The buffers are put back after
    each run and each run gets its own copy of the inputs, so both start from one state.

    Args:
        model: the module to check; left as it was.
        input_args, input_kwargs: as for `log_forward_pass`.
        random_seed: seed of both runs (random when None).
        verbose: print each failed check (pass, check, max difference) and a summary.

    Returns:
        True when the outputs match the plain run, every op replays to its saved value
        and every parent it lists changes its output; False otherwise.

    Raises:
        The errors of `log_forward_pass` for bad arguments, and whatever the model raises.

    Random ops are replayed with the CPU RNG state recorded before them; random ops on
    CUDA tensors are not reproduced yet and fail the replay check.

    Example:
        >>> import torch, torchlog
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
        >>> torchlog.validate_saved_activations(net, torch.randn(2, 3))
        True
    """
    seed = new_seed() if random_seed is None else random_seed
    input_kwargs = {} if input_kwargs is None else input_kwargs
    args, kwargs = _fresh((positional_args(model, input_args), input_kwargs))
    with seeded(seed), model_kept(list(model.named_modules())):
        expected = model(*args, **kwargs)
    args, kwargs = _fresh((input_args, input_kwargs))
    history = log_forward_pass(model, args, kwargs, random_seed=seed, save_function_args=True,
                               detach_saved_tensors=True)
    problems = _compare_outputs(history.passes, expected)
    report = find_replay_problems(history)
    report.problems[:0] = problems
    if verbose:
        _print_report(report)
    return not report.problems


def find_replay_problems(history: Any, check_perturbation: bool = True) -> ReplayReport:
    """Replay every op of `history` that kept its function arguments and check it.

    `history` must be logged with `save_function_args=True` and its activations saved;
    ops without them are counted as skipped. The history is not changed.

    Returns:
        A report listing each failed replay or perturbation check.
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
            problem = _check_parents(record, values, calls[call], report)
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
        mismatch = _mismatch(record.tensor_contents, tensor.detach())
        if mismatch is not None:
            problems.append(ReplayProblem(
                record.label, "outputs",
                f"saved output differs from a plain forward pass with the same seed: {mismatch[0]}",
                mismatch[1]))
    return problems


# ----- replay --------------------------------------------------------------------------------
def _replayable(record: PassRecord, values: dict[str, Any]) -> bool:
    if record.func_args is None or record.func_name in _UNDEFINED_VALUES or _is_alias_write(record):
        return False
    if not isinstance(values.get(record.label), torch.Tensor):
        return False
    return all(isinstance(values.get(edge.label), torch.Tensor) for edge in record.parents)


def _check_replay(record: PassRecord, values: dict[str, Any]) -> ReplayProblem | None:
    try:
        outputs = _replay(record, values)
    except Exception as exc:  # the op itself failed on its saved inputs: report, go on
        return ReplayProblem(record.label, "replay",
                             f"re-running {record.func_name!r} on the saved parents raised "
                             f"{type(exc).__name__}: {exc}")
    if record.output_index >= len(outputs):
        return ReplayProblem(record.label, "replay",
                             f"re-running {record.func_name!r} gave {len(outputs)} tensors, "
                             f"but this pass is output {record.output_index}")
    mismatch = _mismatch(values[record.label], outputs[record.output_index])
    if mismatch is None:
        return None
    parents = ", ".join(record.parent_labels) or "no parents"
    return ReplayProblem(record.label, "replay",
                         f"{record.func_name!r} re-run on the saved values of ({parents}) does "
                         f"not give the saved activation: {mismatch[0]}", mismatch[1])


def _replay(record: PassRecord, values: dict[str, Any],
            swap: tuple[str, torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Re-run the op with each parent's saved value (or `swap`'s) where its tensor was.

    Every parent gets one fresh clone, shared by all the slots it filled, so in-place
    ops cannot touch the saved values and `x + x` still passes one tensor twice.
    Returns every tensor of the result, in the order capture numbered them.
    """
    func, args, kwargs = record.func_args
    slots = {"args": list(args), "kwargs": dict(kwargs)}
    clones: dict[str, torch.Tensor] = {}
    for edge in record.parents:
        if edge.label not in clones:
            source = swap[1] if swap is not None and swap[0] == edge.label else values[edge.label]
            clones[edge.label] = source.clone()
        _put(slots, edge.arg, clones[edge.label])
    with torch.no_grad(), _rng(record.rng_state):
        out = func(*slots["args"], **slots["kwargs"])
    if func is _SETITEM:  # returns None: the result is the written-to tensor
        return [slots["args"][0]]
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for t, _ in find_tensors(out)]


def _put(slots: dict[str, Any], arg: Any, value: torch.Tensor) -> None:
    """Place `value` at argument slot `arg`: an int, a kwarg name, or a path into a container."""
    path = arg if isinstance(arg, tuple) else (arg,)
    head = path[0]
    container = slots["args"] if isinstance(head, int) else slots["kwargs"]
    container[head] = _replaced(container[head], path[1:], value)


def _replaced(old: Any, path: tuple, value: torch.Tensor) -> Any:
    # Copies each container on the path, so the recorded arguments stay as they were.
    if not path:
        return value
    key, rest = path[0], path[1:]
    if isinstance(old, dict):
        new = dict(old)
        new[key] = _replaced(old[key], rest, value)
        return new
    items = list(old)
    items[key] = _replaced(old[key], rest, value)
    if isinstance(old, list):
        return items
    return type(old)(*items) if hasattr(old, "_fields") else type(old)(items)


@contextlib.contextmanager
def _rng(state: torch.Tensor | None) -> Iterator[None]:
    """Run with the CPU RNG in `state` (as before the recorded op), then put it back."""
    if state is None:
        yield
        return
    before = torch.get_rng_state()
    torch.set_rng_state(state)
    try:
        yield
    finally:
        torch.set_rng_state(before)


# ----- perturbation --------------------------------------------------------------------------
def _check_parents(record: PassRecord, values: dict[str, Any], outputs: dict[int, Any],
                   report: ReplayReport) -> ReplayProblem | None:
    """Check that each parent moves some output of the call (`outputs`: index -> saved)."""
    generator = torch.Generator().manual_seed(record.op_index)
    for label in record.parent_labels:
        if _ignores_parent_values(record, label, values, list(outputs.values())):
            continue
        outcome = _moves_output(record, values, label, outputs, generator)
        if outcome is False:
            return ReplayProblem(record.label, "perturb",
                                 f"{record.func_name!r} gave the same output with other values "
                                 f"in parent {label!r}: it does not seem to read that parent")
        report.num_perturbed += outcome is True
    return None


def _moves_output(record: PassRecord, values: dict[str, Any], label: str,
                  outputs: dict[int, Any], generator: torch.Generator) -> bool | None:
    """True if some perturbation of `label` changes an output, False if none does, None
    when no perturbation could be made or run (the op rejects other values: indexes)."""
    tried = False
    for _ in range(_NUM_TRIES):
        other = _perturbed(values[label], generator)
        if other is None:
            break
        try:
            result = _replay(record, values, (label, other))
        except Exception:  # e.g. an index out of range: this draw says nothing
            continue
        tried = True
        if any(i < len(result) and _mismatch(saved, result[i]) is not None
               for i, saved in outputs.items()):
            return True
    return False if tried else None


def _perturbed(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor | None:
    """Different values of the same shape, dtype and layout; None when none exist."""
    if t.numel() == 0:
        return None
    cpu = t.detach().cpu()
    if t.dtype == torch.bool:
        new = torch.randint(0, 2, t.shape, generator=generator).bool()
    elif t.is_floating_point() or t.is_complex():
        finite = cpu[torch.isfinite(cpu)].abs().double() if not t.is_complex() else cpu.abs()
        scale = float(finite.max()) if finite.numel() else 1.0
        new = torch.randn(t.shape, generator=generator, dtype=torch.float64) * max(scale, 1.0)
        new = new.to(t.dtype) if not t.is_complex() else (new + 1j * new.flip(-1)).to(t.dtype)
    else:
        low, high = min(int(cpu.min()), 0), max(int(cpu.max()), 1)
        new = torch.randint(low, high + 1, t.shape, generator=generator).to(t.dtype)
    if torch.equal(new, cpu):
        return None
    return new.to(t.device)


def _ignores_parent_values(record: PassRecord, label: str, values: dict[str, Any],
                           outputs: list[Any]) -> bool:
    """Cases where the outputs legitimately stay put when parent `label` changes.

    - the op reads only the parent's shape/dtype (`zeros_like`, `x.view_as(parent)`),
      or overwrites it whole (`parent.fill_(0)`, `parent[:] = v`, `out=parent`);
    - batch/instance norm in training mode only updates its running statistics
      (arguments 1 and 2), never reads them;
    - `where`/`masked_fill` whose condition selects no element of the parent;
    - every output is a mask (bool) or an index computed from floats: a predicate
      (`isnan(x)`, `mask.all()`) or an argmax can be the same for many inputs;
    - every output is constant (all elements equal, e.g. `0 * x`): nothing can show
      a dependence.
    """
    name = record.func_name
    slots = [edge.arg for edge in record.parents if edge.label == label]
    if name in _SHAPE_ONLY or all(s == "out" for s in slots):
        return True
    if name in _SHAPE_OF_OTHER and all(s not in (0, "input", "self") for s in slots):
        return True
    if name in _OVERWRITES_FIRST and all(s in (0, "self") for s in slots):
        return True
    if record.func_args[0] is _SETITEM and slots == [0] and _setitem_covers_all(record, values):
        return True
    if name in _NORMS and _norm_uses_batch_stats(record) and all(s in (1, 2) for s in slots):
        return True
    if name in ("where", "masked_fill", "masked_fill_") and _unselected(record, slots, values):
        return True
    parent = values[label]
    return all(_is_mask_or_index(t, parent) or _is_constant(t) for t in outputs)


def _is_mask_or_index(output: torch.Tensor, parent: torch.Tensor) -> bool:
    return output.dtype == torch.bool or (not _is_continuous(output) and _is_continuous(parent))


def _is_constant(t: torch.Tensor) -> bool:
    return t.numel() > 1 and bool((t == t.flatten()[0]).all())


def _unselected(record: PassRecord, slots: list, values: dict[str, Any]) -> bool:
    """Whether a `where`/`masked_fill` condition picks no element from the parent at `slots`.

    torch.where(cond, a, b) and a.where(cond, b) read `a` where cond holds and `b`
    elsewhere; a.masked_fill(mask, v) reads `a` where mask does not hold and `v` where it does.
    """
    func = record.func_args[0]
    cond_slot = 0 if func is torch.where else 1
    cond = _arg_value(record, cond_slot, values)
    if not isinstance(cond, torch.Tensor) or cond.dtype != torch.bool:
        return False
    kept_where_true = {0: True, 2: False} if func is not torch.where else {1: True, 2: False}
    if record.func_name.startswith("masked_fill"):
        kept_where_true = {0: False, 2: True}
    reads = [kept_where_true.get(s) for s in slots]
    if any(r is None for r in reads):
        return False
    return all(not bool(cond.any()) if r else bool(cond.all()) for r in reads)


def _arg_value(record: PassRecord, slot: int, values: dict[str, Any]) -> Any:
    """The value the op got at positional `slot`: a parent's saved value or the recorded one."""
    for edge in record.parents:
        if edge.arg == slot:
            return values[edge.label]
    _, args, _ = record.func_args
    return args[slot] if slot < len(args) else None


def _setitem_covers_all(record: PassRecord, values: dict[str, Any]) -> bool:
    """Whether `target[index] = value` writes every element of target."""
    target = values[record.parents[0].label]
    written = torch.zeros(target.shape, dtype=torch.bool, device=target.device)
    _, args, _ = record.func_args
    index = args[1]
    for edge in record.parents:  # a tensor index: use its saved value
        if edge.arg == 1:
            index = values[edge.label]
        elif isinstance(edge.arg, tuple) and edge.arg[0] == 1:
            index = _replaced(index, edge.arg[1:], values[edge.label])
    try:
        written[index] = True
    except (IndexError, RuntimeError, TypeError):  # an index we cannot re-apply: check it
        return False
    return bool(written.all())


def _norm_uses_batch_stats(record: PassRecord) -> bool:
    _, args, kwargs = record.func_args
    flag = args[5] if len(args) > 5 else kwargs.get("training", kwargs.get("use_input_stats"))
    return bool(flag)


def _is_continuous(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


# ----- comparing -----------------------------------------------------------------------------
def _mismatch(saved: Any, other: Any) -> tuple[str, float | None] | None:
    """None when `other` equals `saved` (within float tolerance), else (why, max difference)."""
    if not isinstance(saved, torch.Tensor) or not isinstance(other, torch.Tensor):
        return (f"expected a tensor, got {type(other).__name__} vs {type(saved).__name__}", None)
    if saved.shape != other.shape:
        return (f"shape {tuple(other.shape)} instead of {tuple(saved.shape)}", None)
    if saved.dtype != other.dtype:
        return (f"dtype {other.dtype} instead of {saved.dtype}", None)
    saved, other = saved.detach(), other.detach().to(saved.device)
    if not _is_continuous(saved):
        if torch.equal(saved, other):
            return None
        return ("values differ", float((saved.double() - other.double()).abs().max()))
    rtol, atol = (1e-2, 1e-3) if saved.element_size() <= 2 else (1e-4, 1e-5)
    if torch.allclose(saved, other, rtol=rtol, atol=atol, equal_nan=True):
        return None
    diff = (saved - other).abs().double()
    same = (saved == other) | (torch.isnan(saved) & torch.isnan(other))
    diff = torch.where(same, torch.zeros_like(diff), diff.nan_to_num(nan=float("inf")))
    return ("values differ", float(diff.max()))


def _print_report(report: ReplayReport) -> None:
    for problem in report.problems:
        print(f"torchlog validation: {problem}")
    verdict = "FAILED" if report.problems else "passed"
    print(f"torchlog validation {verdict}: {report.num_replayed} ops replayed, "
          f"{report.num_perturbed} parent dependences confirmed, {report.num_skipped} skipped, "
          f"{len(report.problems)} problems")
