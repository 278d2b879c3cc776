"""tests/golden_compare.py: which tokens are floats, and what counts as a difference."""
from __future__ import annotations

import pytest

from tests import golden_compare
from tests.golden_compare import assert_matches, check_golden, differences, split_numbers


def test_digits_inside_words_are_text_and_lone_numbers_are_numbers():
    pieces, numbers = split_numbers('linear_1_1 (2, 4), 32 B "#1F5FBF" torch 2.13.0 conv2d_3_7:2 -0.5,')
    assert numbers == ["2", "4", "32", "2", "-0.5"]
    assert "linear_1_1" in pieces[0] and "2.13.0 conv2d_3_7:" in pieces[3]
    assert split_numbers("std 1e-05 nan inf")[1] == ["1e-05"]


def test_floats_pass_within_tolerance_and_fail_beyond_it():
    assert differences("mean -0.6646141,\n", "mean -0.6646142,\n") == []
    assert differences("mean 1e-09\n", "mean -2e-09\n") == []  # near 0: the absolute floor
    assert differences("mean 0.6656142\n", "mean 0.6646142\n")
    assert differences("mean 0.001\n", "mean 0.0\n")


def test_text_integers_and_line_counts_must_match_exactly():
    assert "integers must be equal" in differences("numel 100001\n", "numel 100000\n")[0]
    assert "text differs" in differences("relu_1_3 0.5\n", "relu_1_2 0.5\n")[0]
    assert "text differs" in differences("std nan\n", "std 0.5\n")[0]
    assert "3 lines where the golden file has 2" in differences("a\nb\nc\n", "a\nb\n")[0]
    with pytest.raises(AssertionError, match="line 2: 3 where the golden file has 4"):
        assert_matches("x 1.0\ny 3\n", "x 1.0\ny 4\n", "a text")


def test_a_missing_golden_file_says_how_to_create_it(tmp_path, monkeypatch):
    monkeypatch.setattr(golden_compare, "UPDATE", False)  # as in a plain test run
    with pytest.raises(AssertionError, match="TORCHLOG_UPDATE_GOLDEN=1"):
        check_golden(tmp_path / "missing.txt", "text\n")
