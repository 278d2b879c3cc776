"""One row of a comparison per pass: both sides' labels, shapes and dtypes, its status and differences."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from torchlog.comparison.differences import Difference
from torchlog.comparison.tolerances import Tolerance

__all__ = ["Status", "Row"]


class Status(str, Enum):
    """How a pass of one run compares with its partner in the other."""

    MATCH = "match"  # within tolerance
    DIFFERS = "differs"  # outside tolerance
    SHAPE = "shape"  # paired, with outputs of different shapes
    ONLY_A = "only_a"  # nothing in run b pairs with it
    ONLY_B = "only_b"  # nothing in run a pairs with it
    NOT_SAVED = "not_saved"  # a run did not save its value
    # Values no run can reproduce: uninitialised memory (`empty`), a random draw under
    # different seeds, or a saved value that is not a tensor (activation_postfunc)
    NOT_COMPARABLE = "not_comparable"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Row:
    """A pass of run a and its partner in run b (either may be None), and how they compare."""

    position: int  # 0-based index of the row in the comparison
    label_a: str | None  # the pass of run a, e.g. 'linear_3_20'; None for only_b
    label_b: str | None  # its partner in run b; None for only_a
    func_name: str  # the function that ran ('linear'), from run a when paired
    module: str | None  # innermost module address, from run a when paired
    call_site: str | None  # 'file.py:42 in forward' of the op, from run a when paired
    call_site_b: str | None  # the call site of b's pass (a port's own line); None for only_a
    shape_a: tuple[int, ...] | None
    shape_b: tuple[int, ...] | None
    dtype_a: torch.dtype | None
    dtype_b: torch.dtype | None
    status: Status
    tolerance: Tolerance  # what `match` meant for this row
    diff: Difference | None = None  # b against a, when both values were compared
    # b's op re-run on a's parent values (cast to the dtypes b saw) against a's value;
    # None when b kept no function arguments or the op cannot be re-run
    local: Difference | None = None

    @property
    def label(self) -> str:
        """Run a's label, or run b's for a pass only b ran."""
        return self.label_a if self.label_a is not None else self.label_b  # type: ignore[return-value]

    @property
    def is_paired(self) -> bool:
        return self.label_a is not None and self.label_b is not None

    @property
    def max_abs_diff(self) -> float | None:
        return None if self.diff is None else self.diff.max_abs

    @property
    def max_rel_diff(self) -> float | None:
        return None if self.diff is None else self.diff.max_rel

    @property
    def rel_l2(self) -> float | None:
        return None if self.diff is None else self.diff.rel_l2

    @property
    def cosine(self) -> float | None:
        return None if self.diff is None else self.diff.cosine

    @property
    def local_error(self) -> float | None:
        """Relative L2 of the local error (None when not computed)."""
        return None if self.local is None else self.local.rel_l2

    @property
    def adds_error(self) -> bool | None:
        """Whether the op's local error is outside tolerance: the op adds error rather
        than only carrying in its parents'. None when the local error is unknown."""
        return None if self.local is None else not self.local.within(self.tolerance)

    def __repr__(self) -> str:
        figure = "" if self.diff is None else f" rel_l2={self.diff.rel_l2:.3g}"
        return f"<Row {self.label_a} ~ {self.label_b}: {self.status}{figure}>"
