"""The words on the graph and DOT quoting (vis/text.py, vis/dot.py helpers)."""
from __future__ import annotations

import pytest

from torchlog.records import ParamInfo
from torchlog.vis.dot import attr_list, html_escape, quote
from torchlog.vis.text import arg_text, params_text, passes_text, shape_text


@pytest.mark.parametrize("nums, text", [
    ((1,), "1"), ((2, 3, 4), "2-4"), ((1, 2, 3, 5), "1-3, 5"), ((5, 1, 3, 2), "1-3, 5"),
    ((1, 3, 5), "1, 3, 5"), ((4, 4), "4"),
])
def test_passes_text(nums, text) -> None:
    assert passes_text(nums) == text


@pytest.mark.parametrize("arg, text", [
    (0, "arg 0"), (2, "arg 2"), ("other", "kwarg other"), ((0, 1), "arg 0[1]"),
    (("tensors", 2), "kwarg tensors[2]"), ((1, "key"), "arg 1['key']"), ((), ""),
])
def test_arg_text(arg, text) -> None:
    assert arg_text(arg) == text


def test_shape_text() -> None:
    assert [shape_text(s) for s in [(6, 5), (4,), ()]] == ["(6, 5)", "(4,)", "()"]


def test_params_text_caps_the_list() -> None:
    params = [ParamInfo(f"p{i}", (i + 1, 2), 2 * (i + 1), 8 * (i + 1)) for i in range(6)]
    assert params_text(params[:2]) == "params: (1, 2), (2, 2)"
    assert params_text(params) == "params: (1, 2), (2, 2), (3, 2), (4, 2), +2 more"


def test_quote_escapes_what_dot_would_read_as_syntax() -> None:
    assert quote('say "hi"') == r'"say \"hi\""'
    assert quote("two\nlines") == r'"two\nlines"'
    assert quote("back\\slash") == r'"back\\slash"'


def test_html_labels_are_escaped_and_unquoted() -> None:
    assert html_escape('<A & "B">') == "&lt;A &amp; &quot;B&quot;&gt;"
    assert attr_list({"a": "1"}) == ' [a="1"]'
    assert attr_list({}) == ""
