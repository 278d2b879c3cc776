"""Comparing two logged runs op by op (`torchlog.compare`): where they part, and the error each op adds on its own."""
from torchlog.comparison.alignment import Pair, align
from torchlog.comparison.comparing import compare
from torchlog.comparison.differences import Difference, difference
from torchlog.comparison.nonfinite import find_nonfinite, first_nonfinite
from torchlog.comparison.result import Comparison
from torchlog.comparison.rows import Row, Status
from torchlog.comparison.tolerances import Tolerance

__all__ = ["compare", "Comparison", "Row", "Status", "Difference", "Tolerance", "Pair", "align",
           "difference", "find_nonfinite", "first_nonfinite"]
