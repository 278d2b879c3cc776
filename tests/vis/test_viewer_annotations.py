"""The viewer's annotations argument: marks, panel sections, legend notes and the value title as
the page carries them, and a clear error for each bad input, naming the value."""
from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
import torch
from torch import nn

import torchlog
from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError, LayerNotFoundError
from torchlog.vis.viewer import Annotations, page_html
from torchlog.vis.viewer.annotations import MAX_MARKS


class Looped(nn.Module):
    """A Linear run three times, then a ReLU: layer linear_1_1 has three passes."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = self.fc(x)
        return torch.relu(x)


@pytest.fixture(scope="module")
def history() -> torchlog.ModelHistory:
    torch.manual_seed(0)
    return torchlog.log_forward_pass(Looped(), torch.randn(2, 3))


def _data(page: str) -> dict[str, Any]:
    found = re.search(r'<script id="torchlog-data" type="application/json">(.*?)</script>', page, re.S)
    assert found
    return json.loads(found.group(1))


def test_the_page_carries_marks_sections_notes_and_the_value_title(history) -> None:
    assert [r.label for r in history][1:5] == ["linear_1_1:1", "linear_1_1:2", "linear_1_1:3", "relu_1_2"]
    notes = Annotations(marks={"linear_1_1": "skipped", "input_1_0": "given"},
                        sections={"relu_1_2": {"other": {"max": 1 / 3, "n": 7, "dtype": "bf16",
                                                         "gap": math.nan, "top": -math.inf}},
                                  "linear_1_1:2": {"other": {"max": 2.0, "n": 1, "dtype": "x",
                                                             "gap": 0.5, "top": 1.0}, "more": {}}},
                        notes=["4 ops only elsewhere"], value_title="mine")
    data = _data(page_html(history, colour_by={"relu_1_2": 0.5}, colour_legend="d", annotations=notes))
    colour = data["colour"]
    assert colour["values"] == {"relu_1_2": 0.5} and colour["title"] == "d"
    assert colour["markNames"] == ["skipped", "given"]
    assert colour["marks"] == {"linear_1_1:1": 0, "linear_1_1:2": 0, "linear_1_1:3": 0, "input_1_0": 1}
    assert colour["notes"] == ["4 ops only elsewhere"] and data["valueTitle"] == "mine"
    layouts, passes = data["sections"]["layouts"], data["sections"]["passes"]
    assert layouts == [["other", ["max", "n", "dtype", "gap", "top"]], ["more", []]]
    assert passes["relu_1_2"] == [[0, [0.3333333, 7, "bf16", "NaN", "-Inf"]]]  # seven digits kept
    assert passes["linear_1_1:2"] == [[0, [2.0, 1, "x", 0.5, 1.0]], [1, []]]
    assert set(passes) == {"relu_1_2", "linear_1_1:2"}


def test_marks_or_notes_alone_give_a_colouring_with_no_values(history) -> None:
    data = _data(page_html(history, annotations=Annotations(notes=["a note"])))
    assert data["colour"] == {"title": "value", "values": {}, "notes": ["a note"]}
    plain = _data(page_html(history, annotations=Annotations()))
    assert "colour" not in plain and "sections" not in plain and "valueTitle" not in plain


@pytest.mark.parametrize(("given", "error", "names"), [
    ("marks", InvalidArgumentTypeError, "Annotations"),
    (Annotations(marks=["relu_1_2"]), InvalidArgumentTypeError, "['relu_1_2']"),
    (Annotations(marks={"relu_9_9": "x"}), LayerNotFoundError, "relu_9_9"),
    (Annotations(marks={3: "x"}), InvalidArgumentTypeError, "3"),
    (Annotations(marks={"relu_1_2": " "}), InvalidOptionError, "' '"),
    (Annotations(marks={"relu_1_2": None}), InvalidArgumentTypeError, "None"),
    (Annotations(marks={"relu_1_2": "paired"}), InvalidOptionError, "0.5"),  # has a colour value
    (Annotations(sections={"relu_1_2": {"t": {"x": torch.tensor(1.0)}}}), InvalidArgumentTypeError,
     "Annotations.sections['relu_1_2']['t']['x'] must be a str or a real number, got tensor(1.)"),
    (Annotations(sections={"relu_1_2": {"t": {"x": None}}}), InvalidArgumentTypeError, "got None"),
    (Annotations(sections={"relu_1_2": {"t": {"x": True}}}), InvalidArgumentTypeError, "got True"),
    (Annotations(sections={"relu_1_2": {"t": [1.0]}}), InvalidArgumentTypeError, "[1.0]"),
    (Annotations(sections={"relu_1_2": {("t",): {}}}), InvalidArgumentTypeError, "('t',)"),
    (Annotations(sections={"relu_1_2": {"t": {0: 1.0}}}), InvalidArgumentTypeError, "got 0"),
    (Annotations(sections={"relu_x": {}}), LayerNotFoundError, "relu_x"),
    (Annotations(notes="one line"), InvalidArgumentTypeError, "one line"),
    (Annotations(notes=["fine", 2]), InvalidArgumentTypeError, "holds 2"),
    (Annotations(value_title=b"run a"), InvalidArgumentTypeError, "b'run a'"),
])
def test_bad_annotations_are_refused_naming_the_value(history, given, error, names) -> None:
    with pytest.raises(error, match=re.escape(names)):
        page_html(history, colour_by={"relu_1_2": 0.5}, annotations=given)


def test_more_mark_names_than_the_page_tells_apart_are_refused(history) -> None:
    keys = [r.label for r in history] + ["linear_1_1"]  # six passes, and a layer of three
    assert len(keys) == MAX_MARKS + 1
    too_many = {key: f"why {i}" for i, key in enumerate(keys)}
    with pytest.raises(InvalidOptionError, match=re.escape(f"at most {MAX_MARKS}") + ".*'why 6'|'why 6'.*"
                       + re.escape(f"at most {MAX_MARKS}")):
        page_html(history, annotations=Annotations(marks=too_many))
    fits = dict(list(too_many.items())[:MAX_MARKS])
    assert _data(page_html(history, annotations=Annotations(marks=fits)))["colour"]["markNames"] == \
        [f"why {i}" for i in range(MAX_MARKS)]


def test_the_history_methods_hand_annotations_to_the_viewer(history, tmp_path) -> None:
    notes = Annotations(marks={"relu_1_2": "skipped"}, notes=["one note"])
    path = history.to_html(str(tmp_path / "page.html"), colour_by={"linear_1_1": 0.25}, annotations=notes)
    with open(path, encoding="utf-8") as page:
        colour = _data(page.read())["colour"]
    assert colour["marks"] == {"relu_1_2": 0} and colour["markNames"] == ["skipped"]
    assert colour["notes"] == ["one note"]
    shown = _data(history.show(annotations=notes))["colour"]
    assert shown["marks"] == {"relu_1_2": 0} and shown["notes"] == ["one note"]
    with pytest.raises(InvalidArgumentTypeError, match="annotations"):
        history.to_html(str(tmp_path / "bad.html"), annotations={"relu_1_2": "skipped"})
