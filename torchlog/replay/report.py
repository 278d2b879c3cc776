"""What replay validation found: one problem per failed check, and a report of the whole run."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ReplayProblem", "ReplayReport", "print_report"]


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


def print_report(report: ReplayReport) -> None:
    """Print each problem, then one line of totals and the verdict."""
    for problem in report.problems:
        print(f"torchlog validation: {problem}")
    verdict = "FAILED" if report.problems else "passed"
    print(f"torchlog validation {verdict}: {report.num_replayed} ops replayed, "
          f"{report.num_perturbed} parent dependences confirmed, {report.num_skipped} skipped, "
          f"{len(report.problems)} problems")

