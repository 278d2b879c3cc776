"""Compare text with a golden file: the text exactly, printed floats within a tolerance.

A golden file holds what a renderer or exporter printed. Its words, labels, shapes and
other integers are the same on every machine, so they must match exactly. Its floats are
computed values (activation statistics, gradient norms): another CPU's kernels may round
their last bit differently, so two printings of the same statistic can differ in the last
digit. Floats are therefore parsed out of the text and compared as numbers.

A float is a number token written with a decimal point or an exponent (`0.25`, `-1e-05`);
an integer token (`32`, `(2, 4)`) must match exactly, since counts and shapes do not
depend on rounding. A digit inside a word (`linear_1_1`, `conv2d`, `#1F5FBF`, `2.13.0`)
is part of the text, not a number.

Regenerate golden files after an intended change with `TORCHLOG_UPDATE_GOLDEN=1`: a file is
rewritten only when it no longer matches, so rerunning on another CPU does not churn it.
"""
from __future__ import annotations

import difflib
import math
import os
import re
from pathlib import Path

REL_TOL = 1e-5  # float32 kernels differ by a few units in the 7th digit; 1e-5 leaves room
ABS_TOL = 1e-6  # floor for values near 0 (a mean that cancels), where relative tolerance fails
UPDATE = os.environ.get("TORCHLOG_UPDATE_GOLDEN") == "1"
MAX_REPORTED = 8  # differences shown in one failure message

# A number stands alone: no word character or '.' touches it on either side.
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])")


def split_numbers(text: str) -> tuple[list[str], list[str]]:
    """Split `text` into the pieces between number tokens and the number tokens themselves.

    `"mean -0.5, n 3"` gives `(['mean ', ', n ', ''], ['-0.5', '3'])`: the pieces interleave
    with the numbers, one more piece than numbers.
    """
    return NUMBER.split(text), NUMBER.findall(text)


def is_float_token(token: str) -> bool:
    """Whether a number token was printed as a float (with a point or an exponent)."""
    return any(c in token for c in ".eE")


def numbers_match(actual: str, expected: str) -> bool:
    """Integers exactly; when either token is a float, within REL_TOL with an ABS_TOL floor."""
    if not (is_float_token(actual) or is_float_token(expected)):
        return int(actual) == int(expected)
    return math.isclose(float(actual), float(expected), rel_tol=REL_TOL, abs_tol=ABS_TOL)


def _line_differences(number: int, actual: str, expected: str) -> list[str]:
    pieces, numbers = split_numbers(actual)
    want_pieces, want_numbers = split_numbers(expected)
    if pieces != want_pieces:
        return [f"line {number}: text differs\n  expected: {expected!r}\n  actual:   {actual!r}"]
    return [f"line {number}: {got} where the golden file has {want} ({_rule(got, want)})\n"
            f"  expected: {expected!r}\n  actual:   {actual!r}"
            for got, want in zip(numbers, want_numbers) if not numbers_match(got, want)]


def _rule(actual: str, expected: str) -> str:
    if is_float_token(actual) or is_float_token(expected):
        return f"floats may differ by rel {REL_TOL:g} or abs {ABS_TOL:g}"
    return "integers must be equal"


def differences(actual: str, expected: str) -> list[str]:
    """Every place where `actual` departs from `expected` beyond float rounding; [] when none.

    Lines are compared one by one; when the two texts have different numbers of lines, the
    result is one entry holding a unified diff (lines added or removed are not noise).
    """
    lines, want_lines = actual.splitlines(keepends=True), expected.splitlines(keepends=True)
    if len(lines) != len(want_lines):
        diff = difflib.unified_diff(want_lines, lines, "golden", "actual", n=1)
        shown = "".join(list(diff)[:40])
        return [f"{len(lines)} lines where the golden file has {len(want_lines)}:\n{shown}"]
    found: list[str] = []
    for number, (line, want) in enumerate(zip(lines, want_lines), start=1):
        if line != want:
            found.extend(_line_differences(number, line, want))
    return found


def assert_matches(actual: str, expected: str, what: str, advice: str = "") -> None:
    """Raise AssertionError naming `what`, the first differences and `advice` unless the texts match."""
    found = differences(actual, expected)
    assert not found, (
        f"{what} differs from its golden text in {len(found)} place(s):\n"
        + "\n".join(found[:MAX_REPORTED]) + (f"\n{advice}" if advice else ""))


def check_golden(path: Path, actual: str) -> None:
    """Compare `actual` with the golden file at `path` (text exactly, floats within tolerance).

    With TORCHLOG_UPDATE_GOLDEN=1 a missing or differing file is rewritten instead; review
    `git diff` of it before committing, since every changed line is a change users see.

    Raises:
        AssertionError: the file is missing, or `actual` differs from it beyond float rounding;
            the message says how to regenerate it when the change is intended.
    """
    if UPDATE and (not path.exists() or differences(actual, path.read_text(encoding="utf-8"))):
        path.write_text(actual, encoding="utf-8")
    assert path.exists(), f"no golden file {path}; create it with TORCHLOG_UPDATE_GOLDEN=1"
    assert_matches(actual, path.read_text(encoding="utf-8"), f"output compared with {path.name}",
                   "If the change is intended, rerun with TORCHLOG_UPDATE_GOLDEN=1 and review the diff.")
