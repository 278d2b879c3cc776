"""Per-op rules of replay validation: when an output may ignore a parent, and which ops have no values."""
from __future__ import annotations

from typing import Any

import torch

from torchlog.capture import UNDEFINED_VALUES
from torchlog.records import PassRecord
from torchlog.rerun import SETITEM, is_continuous, replaced

__all__ = ["READS_EVERY_VALUE", "UNDEFINED_VALUES", "ignores_parent_values", "may_perturb"]

# Outputs made from their tensor argument's shape, dtype and device only.
_SHAPE_ONLY = frozenset({
    "zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like",
    "randint_like", "new_zeros", "new_ones", "new_empty", "new_full", "_shape_as_tensor",
})
# Ops that use their second argument (`other`) only for its shape or dtype.
_SHAPE_OF_OTHER = frozenset({"type_as", "expand_as", "view_as", "reshape_as", "to"})
# In-place ops that overwrite every element of their first argument (torch.nn.init's too).
_OVERWRITES_FIRST = frozenset({
    "copy_", "set_data", "fill_", "zero_", "normal_", "uniform_", "random_", "exponential_",
    "geometric_", "cauchy_", "log_normal_", "bernoulli_", "constant_", "zeros_", "ones_",
    "eye_", "dirac_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
    "kaiming_normal_", "trunc_normal_", "orthogonal_", "sparse_",
})
_FIRST_SLOTS = (0, "self", "input", "tensor")  # how an op may name its first argument
# Elementwise arithmetic: every element of the output reads the matching element of each
# argument, so an output that a perturbation did not move means a wrong parent link.
# (For other ops an unmoved output is only inconclusive: a zero weight, rounding, ...)
READS_EVERY_VALUE = frozenset(
    name
    for op in ("add", "sub", "mul", "div", "true_divide")
    for name in (op, f"{op}_", f"__{op}__", f"__r{op}__", f"__i{op}__")
) | frozenset({"__truediv__", "__rtruediv__", "__itruediv__"})
_PRODUCTS = frozenset({"mul", "mul_", "__mul__", "__rmul__", "__imul__"})
# Norms taking (input, running_mean, running_var, weight, bias, use_batch_stats, ...).
_NORMS = frozenset({"batch_norm", "instance_norm"})
# Ops whose values are undefined (uninitialised memory): nothing to replay.


def ignores_parent_values(record: PassRecord, label: str, values: dict[str, Any],
                          outputs: list[Any]) -> bool:
    """Whether the outputs may legitimately stay put when parent `label` changes.

    `values` maps labels to saved values; `outputs` are the saved outputs of the call.
    True in these cases:
    - the op reads only the parent's shape/dtype (`zeros_like`, `x.view_as(parent)`),
      or overwrites it whole (`parent.fill_(0)`, `parent[:] = v`, `out=parent`);
    - batch/instance norm in training mode only updates its running statistics
      (arguments 1 and 2), never reads them;
    - `where`/`masked_fill` whose condition selects no element of the parent;
    - every output is a mask (bool) or an index computed from floats: a predicate
      (`isnan(x)`, `mask.all()`) or an argmax can be the same for many inputs;
    - every output is constant (all elements equal, e.g. `0 * x`) or empty (`x[:0]`):
      nothing can show a dependence;
    - `bernoulli(x, p=0.5)` reads only x's shape; `a * b` with the other factor all zeros.
    """
    name = record.func_name
    slots = [edge.arg for edge in record.parents if edge.label == label]
    if name in _SHAPE_ONLY or all(s == "out" for s in slots):
        return True
    if name in _SHAPE_OF_OTHER and all(s not in (0, "input", "self") for s in slots):
        return True
    if name in _OVERWRITES_FIRST and all(s in _FIRST_SLOTS for s in slots):
        return True
    if name == "bernoulli" and _has_probability(record):  # draws with p: reads the shape only
        return True
    if name in _PRODUCTS and _other_factor_is_zero(record, slots, values):
        return True
    if record.func_args[0] is SETITEM and slots == [0] and _setitem_covers_all(record, values):
        return True
    if name in _NORMS and _norm_uses_batch_stats(record) and all(s in (1, 2) for s in slots):
        return True
    if name in ("where", "masked_fill", "masked_fill_") and _unselected(record, slots, values):
        return True
    parent = values[label]
    return all(_is_mask_or_index(t, parent) or _is_constant(t) or t.numel() == 0 for t in outputs)


def _has_probability(record: PassRecord) -> bool:
    _, args, kwargs = record.func_args
    return "p" in kwargs or (len(args) > 1 and isinstance(args[1], float))


def _other_factor_is_zero(record: PassRecord, slots: list, values: dict[str, Any]) -> bool:
    """Whether `a * b` has the factor other than the parent at `slots` all zeros."""
    if len(slots) != 1 or slots[0] not in (0, 1):
        return False
    other = _arg_value(record, 1 - slots[0], values)
    if isinstance(other, torch.Tensor):
        return other.numel() > 0 and not bool(other.detach().any())
    return isinstance(other, (int, float)) and other == 0


def _is_mask_or_index(output: torch.Tensor, parent: torch.Tensor) -> bool:
    return output.dtype == torch.bool or (not is_continuous(output) and is_continuous(parent))


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
            index = replaced(index, edge.arg[1:], values[edge.label])
    try:
        written[index] = True
    except (IndexError, RuntimeError, TypeError):  # an index we cannot re-apply: check it
        return False
    return bool(written.all())


def _norm_uses_batch_stats(record: PassRecord) -> bool:
    _, args, kwargs = record.func_args
    flag = args[5] if len(args) > 5 else kwargs.get("training", kwargs.get("use_input_stats"))
    return bool(flag)


def may_perturb(record: PassRecord, parent: torch.Tensor) -> bool:
    """Whether the perturbation check may give this op other values for `parent`.

    Floats always. Integer and bool tensors only for elementwise arithmetic: elsewhere
    they may be sizes, lengths or indexes that kernels trust without checking (a packed
    sequence's batch sizes), and other values could crash the interpreter.
    """
    return is_continuous(parent) or record.func_name in READS_EVERY_VALUE
