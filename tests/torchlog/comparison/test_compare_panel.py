"""What Comparison.to_html's page holds beyond run a, read from the page's embedded data: each
pass's run b and difference statistics and its row's figures, checked against plain PyTorch on
the two runs' values; the marks of the passes with nothing to compare and the note on the
passes only run b ran; and the peak memory of those statistics for two logs read from disk."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchlog
from tests.torchlog.comparison.memory_peaks import peak_of
from torchlog.comparison.rows import Status


class Port(nn.Module):
    """Linear, ReLU, Linear, tanh. Run a's copy doubles the ReLU's output (a pass only a runs),
    run b's shifts the input first (a pass only b runs, and b's labels move by one)."""

    def __init__(self, doubles: bool, shifts: bool) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 6), nn.Linear(6, 3)
        self.doubles, self.shifts = doubles, shifts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.shifts:
            x = x + 0.5
        h = torch.relu(self.fc1(x))
        if self.doubles:
            h = h * 2.0
        return self.fc2(h).tanh()


def port_runs() -> tuple[torchlog.ModelHistory, torchlog.ModelHistory]:
    """Run a (ReLU not saved) and run b of Port: one pass only in a, one only in b, one
    not saved, the others compared."""
    torch.manual_seed(0)
    model_a, model_b = Port(doubles=True, shifts=False), Port(doubles=False, shifts=True)
    model_b.load_state_dict(model_a.state_dict())
    x = torch.randn(5, 4)
    labels = [r.label for r in torchlog.log_forward_pass(model_a, x, layers_to_save=None)]
    a = torchlog.log_forward_pass(model_a, x, keep_unsaved_layers=True,
                                  layers_to_save=[l for l in labels if not l.startswith("relu")])
    return a, torchlog.log_forward_pass(model_b, x)


def embedded_data(path: str | Path) -> dict[str, Any]:
    """The JSON a written page carries in its `torchlog-data` script."""
    text = Path(path).read_text(encoding="utf-8")
    found = re.search(r'<script id="torchlog-data" type="application/json">(.*?)</script>', text, re.S)
    assert found, "the page has no torchlog-data script"
    return json.loads(found.group(1))


def sections_of(data: dict[str, Any], label: str) -> dict[str, dict[str, Any]]:
    """A pass's panel tables as {title: {entry: value}}, from the page's layouts."""
    layouts = data["sections"]["layouts"]
    out = {}
    for layout, values in data["sections"]["passes"][label]:
        title, names = layouts[layout]
        out[title] = dict(zip(names, values))
    return out


def over_tolerance(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> float:
    """The page's colour of a pair (the oracle): log10 of max |a - b| / (atol + rtol max |a|),
    0 where that is at most 1 (within tolerance)."""
    x, y = a.detach().double(), b.detach().double()
    ratio = float((x - y).abs().max()) / (atol + rtol * float(x.abs().max()))
    return max(0.0, math.log10(ratio)) if ratio > 0 else 0.0


def check_stats(table: dict[str, Any], value: torch.Tensor) -> None:
    """The statistics in a panel table against plain PyTorch (population std, finite entries)."""
    x = value.detach().double().reshape(-1)
    finite = x[torch.isfinite(x)]
    assert table["elements"] == x.numel()
    assert table["NaN"] == int(torch.isnan(x).sum()) and table["Inf"] == int(torch.isinf(x).sum())
    assert float(table["zeros"].removesuffix(" %")) == pytest.approx(100 * float((x == 0).double().mean()), abs=0.05)
    for name, want in (("min", finite.min()), ("max", finite.max()), ("mean", finite.mean()),
                       ("std", finite.std(correction=0))):
        assert table[name] == pytest.approx(float(want), rel=1e-6, abs=1e-12), name


def test_each_compared_pass_shows_b_the_difference_and_the_figures(tmp_path: Path) -> None:
    a, b = port_runs()
    comparison = torchlog.compare(a, b)
    data = embedded_data(comparison.to_html(str(tmp_path / "port.html")))
    compared = [row for row in comparison if row.status in (Status.MATCH, Status.DIFFERS)]
    assert [row.label_a for row in compared] == ["input_1_0", "linear_1_1", "linear_2_4", "tanh_1_5", "output_1_6"]
    for row in compared:
        x, y = a[row.label_a].tensor_contents.detach(), b[row.label_b].tensor_contents.detach()
        tables = sections_of(data, row.label_a)
        assert list(tables) == ["run b", "difference a - b (float32)", "comparison"]
        check_stats(tables["run b"], y)
        check_stats(tables["difference a - b (float32)"], x - y)  # float32, as compare works
        figures, dx, dy = tables["comparison"], x.double(), y.double()
        assert figures["status"] == str(row.status)
        assert figures["max |a - b|"] == pytest.approx(float((dx - dy).abs().max()), rel=1e-5, abs=1e-12)
        assert figures["rel. L2"] == pytest.approx(float((dx - dy).norm() / dx.norm()), rel=1e-5, abs=1e-12)
        assert figures["cosine"] == pytest.approx(float(torch.nn.functional.cosine_similarity(
            dx.reshape(-1), dy.reshape(-1), dim=0)), rel=1e-5)
        want = over_tolerance(x, y, 1e-5, 1e-7)  # float32's tolerance
        assert data["colour"]["values"][row.label_a] == pytest.approx(want, rel=1e-5, abs=1e-9)
        dx64, dy64 = x.double(), y.double()
        ratio = float((dx64 - dy64).abs().max()) / (1e-7 + 1e-5 * float(dx64.abs().max()))
        assert figures["max |a - b| / tolerance"] == pytest.approx(ratio, rel=1e-5, abs=1e-9)
        assert (ratio <= 1) == (row.status is Status.MATCH)  # the panel's figure says why
    assert sections_of(data, "linear_1_1")["run b"]["label"] == "linear_1_2"  # b's own label
    assert "label" not in sections_of(data, "linear_2_4")["run b"]  # the same label: not repeated
    assert data["valueTitle"] == "run a" and data["view"]["focus"] == "linear_1_1"


def test_passes_with_nothing_to_compare_are_marked_and_passes_only_in_b_noted(tmp_path: Path) -> None:
    a, b = port_runs()
    comparison = torchlog.compare(a, b)
    assert comparison["relu_1_2"].status is Status.NOT_SAVED and comparison["mul_1_3"].status is Status.ONLY_A
    data = embedded_data(comparison.to_html(str(tmp_path / "port.html")))
    colour = data["colour"]
    marks = {label: colour["markNames"][index] for label, index in colour["marks"].items()}
    assert marks == {"relu_1_2": "not saved", "mul_1_3": "only in a"}
    assert not set(marks) & set(colour["values"])  # a mark stands for a missing value
    assert colour["notes"] == ["1 pass only in run b, not drawn: add_1_1"]
    relu = sections_of(data, "relu_1_2")  # a's value not saved: b's statistics, no difference
    assert list(relu) == ["run b", "comparison"] and relu["comparison"] == {"status": "not_saved"}
    assert relu["run b"]["label"] == "relu_1_3"
    check_stats(relu["run b"], b["relu_1_3"].tensor_contents)
    assert sections_of(data, "mul_1_3") == {"comparison": {"status": "only_a"}}


def test_a_run_b_in_float64_is_differenced_in_float64(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(4, 3), nn.Tanh()), torch.randn(6, 4)
    a = torchlog.log_forward_pass(model, x)
    b = torchlog.log_forward_pass(model.double(), x.double())
    data = embedded_data(torchlog.compare(a, b).to_html(str(tmp_path / "wide.html")))
    tables = sections_of(data, "tanh_1_2")
    assert tables["run b"]["dtype"] == "float64" and "shape" not in tables["run b"]
    check_stats(tables["run b"], b["tanh_1_2"].tensor_contents)
    check_stats(tables["difference a - b (float64)"],
                a["tanh_1_2"].tensor_contents.double() - b["tanh_1_2"].tensor_contents)


def test_shape_mismatches_show_b_shape_and_no_difference(tmp_path: Path) -> None:
    torch.manual_seed(0)
    a = torchlog.log_forward_pass(nn.Linear(4, 3), torch.randn(2, 4))
    b = torchlog.log_forward_pass(nn.Linear(4, 3), torch.randn(5, 4))
    data = embedded_data(torchlog.compare(a, b).to_html(str(tmp_path / "shapes.html")))
    colour = data["colour"]
    assert {label: colour["markNames"][i] for label, i in colour["marks"].items()} == \
        {r.label: "shape mismatch" for r in a}
    tables = sections_of(data, "linear_1_1")
    assert list(tables) == ["run b", "comparison"] and tables["run b"]["shape"] == "(5, 3)"
    check_stats(tables["run b"], b["linear_1_1"].tensor_contents)


class LogOf(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


def test_nan_at_different_places_is_marked_with_no_finite_difference(tmp_path: Path) -> None:
    x = torch.tensor([[0.5, 2.0, 3.0], [1.5, 0.25, 4.0]])
    a = torchlog.log_forward_pass(LogOf(), -x)  # every log a NaN
    b = torchlog.log_forward_pass(LogOf(), x.clone().index_put_((torch.tensor([0]), torch.tensor([0])), torch.tensor(-1.0)))
    comparison = torchlog.compare(a, b)
    assert comparison["log_1_1"].rel_l2 == float("inf")
    data = embedded_data(comparison.to_html(str(tmp_path / "nan.html")))
    assert data["colour"]["markNames"][data["colour"]["marks"]["log_1_1"]] == "no finite rel. L2"
    tables = sections_of(data, "log_1_1")
    assert tables["comparison"]["rel. L2"] == "Inf"
    check_stats(tables["run b"], b["log_1_1"].tensor_contents)
    diff = a["log_1_1"].tensor_contents - b["log_1_1"].tensor_contents
    assert tables["difference a - b (float32)"]["NaN"] == int(torch.isnan(diff).sum()) == 6


def test_peak_memory_of_the_page_statistics_of_two_files_is_a_few_passes(tmp_path: Path) -> None:
    # Compares two logs, then works out the page's statistics of run b and of the differences.
    peak, num_sections, both_runs, largest = peak_of("""
        from torchlog.comparison.page import page_parts

        tiny = torchlog.load(sys.argv[3])
        page_parts(torchlog.compare(tiny, tiny))  # every library loaded
        comparison = torchlog.compare(torchlog.load(sys.argv[1]), torchlog.load(sys.argv[2]))
        start = reset_peak()
        parts = page_parts(comparison)
        print(status("VmHWM") - start, len(parts.sections))
    """, tmp_path)
    assert num_sections == 22
    assert peak < both_runs / 8, f"peak {peak} B for runs of {both_runs} B"
    # b's value and the difference, and the float64 copy statistics read (two passes' bytes
    # for float32 values): four passes, and a little for the file reads; the histograms the
    # panel draws of both add about half a pass (4.6 measured; 4.05 without them).
    assert peak <= 5 * largest, f"peak {peak} B: more than 5 passes of {largest} B"
