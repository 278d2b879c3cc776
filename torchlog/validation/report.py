"""What replay validation found: one problem per failed check, and a report of the whole run."""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ReplayProblem", "ReplayReport", "print_report"]


@dataclass(frozen=True, slots=True)
class ReplayProblem:
    """One failed check: which pass, which check, and how far off it was."""

    label: str  # the pass that failed, e.g. 'relu_1_2' or 'linear_1_1:3'; 'model' for the whole run
    check: str  # 'outputs', 'replay', 'perturb', or 'run' when the logged run could not be made
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
    # (op, parent) pairs that could not be checked: not perturbed (an integer size or
    # index), no perturbation could be run, or none changed an output the op need not move
    inconclusive: list[ReplayProblem] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Whether no check failed (inconclusive edges are not failures)."""
        return not self.problems


def print_report(report: ReplayReport) -> None:
    """Print each problem and each inconclusive edge, then one line of totals and the verdict."""
    for problem in report.problems:
        print(f"torchlog validation: {problem}")
    for edge in report.inconclusive:
        print(f"torchlog validation: {edge.label}: inconclusive {edge.check} check: {edge.detail}")
    verdict = "FAILED" if report.problems else "passed"
    print(f"torchlog validation {verdict}: {report.num_replayed} ops replayed, "
          f"{report.num_perturbed} parent dependences confirmed, {report.num_skipped} skipped, "
          f"{len(report.inconclusive)} inconclusive, {len(report.problems)} problems")

