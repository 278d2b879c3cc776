"""The viewer page as text (vis/viewer/page.py): ASCII only, and the notebook frame's height."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import torchlog
from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError
from torchlog.vis.viewer.page import MIN_HEIGHT_PX, NOTEBOOK_HEIGHT_PX, show


class Modèle(nn.Module):  # a name beyond ASCII, as a user's may be
    def __init__(self) -> None:
        super().__init__()
        self.couche_é = nn.Linear(3, 3)

    def forward(self, x):
        return self.couche_é(x) * 2


def _history() -> torchlog.ModelHistory:
    return torchlog.log_forward_pass(Modèle(), torch.ones(1, 3))


def test_the_page_is_ascii_and_keeps_non_ascii_names():
    page = show(_history())
    assert str(page).isascii()
    assert "<title>torchlog: Mod&#232;le</title>" in page
    data = json.loads(page.split('type="application/json">', 1)[1].split("</script>", 1)[0])
    assert data["model"] == "Modèle" and "couche_é" in data["modules"]


def test_the_notebook_frame_has_the_height_asked_and_resizes():
    page = show(_history(), height=900)
    frame = page._repr_html_()
    assert frame.isascii() and "height: 900px" in frame and "resize: vertical" in frame
    assert f"height: {NOTEBOOK_HEIGHT_PX}px" in show(_history())._repr_html_()
    assert page.sized(500).height == 500 and page.height == 900  # a copy; the page is unchanged
    with pytest.raises(InvalidOptionError, match=f">= {MIN_HEIGHT_PX} pixels, got 100"):
        show(_history(), height=100)
    with pytest.raises(InvalidArgumentTypeError, match="'tall'"):
        show(_history(), height="tall")


def test_colour_values_are_checked_and_resolved_to_passes():
    from torchlog.errors import LayerNotFoundError
    from torchlog.vis.viewer.colour import colour_data

    history = torchlog.log_forward_pass(_Loop(), torch.ones(1, 2))
    assert colour_data(history, None, "x") is None
    resolved = colour_data(history, {"linear_1_1": 3, "linear_1_1:2": -1.5}, None)
    assert resolved == {"title": "value", "values": {"linear_1_1:1": 3.0, "linear_1_1:2": -1.5,
                                                     "linear_1_1:3": 3.0}}
    with pytest.raises(LayerNotFoundError, match="linear_9_9"):
        colour_data(history, {"linear_9_9": 1.0}, None)
    with pytest.raises(InvalidOptionError, match=r"colour_by\['linear_1_1'\] is nan"):
        colour_data(history, {"linear_1_1": float("nan")}, None)
    with pytest.raises(InvalidArgumentTypeError, match="'big'"):
        colour_data(history, {"linear_1_1": "big"}, None)
    with pytest.raises(InvalidArgumentTypeError, match="list"):
        colour_data(history, [("linear_1_1", 1.0)], None)
    page = show(history, colour_by={"linear_1_1": 1.0}, colour_legend="effect")
    data = json.loads(page.split('type="application/json">', 1)[1].split("</script>", 1)[0])
    assert data["colour"]["title"] == "effect" and len(data["colour"]["values"]) == 3


class _Loop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x):
        for _ in range(3):
            x = self.fc(x)
        return x
