"""The viewer's page data without a browser: golden files, statistics, defaults, bad input."""
from __future__ import annotations

import itertools
import json
import math
import os
import re
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest
import torch
from torch import nn

import torchlog
from tests.golden_compare import NUMBER, assert_matches, check_golden, is_float_token
from tests.models import LongLoop, Nested, SimpleRecurrent
from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError, LogFileNotFoundError
from torchlog.vis.viewer.data import page_data
from torchlog.vis.viewer.page import READABLE_NODES, count_nodes, default_view, page_html
from torchlog.vis.viewer.stats import NUM_BINS, tensor_stats

GOLDEN = Path(__file__).parent / "golden"


def _stable(data: dict) -> dict:
    """Drop what changes from run to run or machine to machine: times and file paths."""
    for entry in data["passes"]:
        entry.pop("timeUs")
        if entry["site"]:
            entry["site"]["file"] = os.path.basename(entry["site"]["file"])
    return data


def _golden_text(data: dict) -> str:
    return json.dumps(_stable(data), indent=1, sort_keys=True) + "\n"


def _check_golden(name: str, data: dict) -> None:
    # The statistics are computed floats: compared within a tolerance, everything else exactly.
    check_golden(GOLDEN / f"viewer_{name}.json", _golden_text(data))


def _nested() -> torchlog.ModelHistory:
    torch.manual_seed(0)
    return torchlog.log_forward_pass(Nested(), torch.randn(2, 4), random_seed=0)


def test_golden_nested_unrolled():
    _check_golden("nested", page_data(_nested(), "unrolled", 2))


def test_golden_recurrent_rolled():
    torch.manual_seed(0)
    history = torchlog.log_forward_pass(SimpleRecurrent(), torch.randn(1, 5), random_seed=0)
    _check_golden("recurrent", page_data(history, "rolled", None))


def _change_floats(text: str, change: Callable[[int, str], str | None]) -> tuple[str, int]:
    """`text` with `change(i, token)` in place of its i-th float token (kept where it gives None)."""
    floats = itertools.count()
    changed = 0

    def replace(match: re.Match) -> str:
        nonlocal changed
        token = match.group()
        new = change(next(floats), token) if is_float_token(token) else None
        changed += new is not None
        return token if new is None else new

    return NUMBER.sub(replace, text), changed


def _one_float32_ulp(index: int, token: str) -> str:
    """The float32 next to `token`'s value, up or down in turn, printed in full."""
    value = torch.tensor(float(token), dtype=torch.float32)
    toward = torch.tensor(math.inf if index % 2 else -math.inf)
    return repr(torch.nextafter(value, toward).item())


def _last_digit_moved(index: int, token: str) -> str | None:
    """A token printed with 7 or more significant digits, one unit off in its last digit."""
    digits = Decimal(token).as_tuple()
    if len(digits.digits) < 7:
        return None
    unit = Decimal((0, (1,), digits.exponent))
    return str(Decimal(token) + (unit if index % 2 else -unit))


def test_golden_page_data_tolerates_last_place_rounding_only():
    """What another CPU's kernels change passes; a change a reader would see fails."""
    fresh = _golden_text(page_data(_nested(), "unrolled", 2))
    golden = (GOLDEN / "viewer_nested.json").read_text(encoding="utf-8")
    num_floats = sum(map(is_float_token, NUMBER.findall(golden)))
    assert num_floats > 50
    ulp_off, changed = _change_floats(golden, _one_float32_ulp)
    assert changed == num_floats and ulp_off != golden
    assert_matches(fresh, ulp_off, "page data against the golden file, every float 1 ulp off")
    digit_off, changed = _change_floats(golden, _last_digit_moved)
    passes = json.loads(golden)["passes"]
    assert changed >= 2 * sum(bool(p["stats"]) for p in passes)  # means and stds have 7 digits
    assert_matches(fresh, digit_off, "page data against the golden file, last digits moved")

    mean = passes[1]["stats"]["mean"]
    one_off, changed = _change_floats(golden, lambda i, t: repr(float(t) + 1e-3) if float(t) == mean else None)
    assert changed == 1
    with pytest.raises(AssertionError, match=re.escape(repr(mean + 1e-3))):
        assert_matches(fresh, one_off, "page data with one mean 1e-3 off")
    relabelled = golden.replace('"label": "relu_1_2"', '"label": "relu_1_3"', 1)
    with pytest.raises(AssertionError, match="relu_1_3"):
        assert_matches(fresh, relabelled, "page data with a label changed")
    recounted = golden.replace('"numel": 8', '"numel": 9', 1)
    with pytest.raises(AssertionError, match="integers must be equal"):
        assert_matches(fresh, recounted, "page data with a count changed")


def test_module_calls_know_their_nesting_inputs_and_outputs():
    history = _nested()
    calls = page_data(history, "unrolled", None)["calls"]
    assert set(calls) == {c for r in history for c in r.containing_modules}
    inner = calls["block1.inner:1"]
    assert (inner["depth"], inner["parent"], inner["address"], inner["call"]) == (2, "block1:1", "block1.inner", 1)
    assert inner["inputs"] == [[2, 4]] and inner["outputs"] == [[2, 4]]
    assert inner["lines"][0] == "block1.inner (Inner)"
    assert calls["block1:1"]["parent"] is None


def test_edges_between_layers_carry_pass_ranges():
    history = torchlog.log_forward_pass(SimpleRecurrent(), torch.randn(1, 5), random_seed=0)
    layers = {l["label"]: l for l in page_data(history, "rolled", None)["layers"]}
    back_edge = next(p for p in layers["linear_1_1"]["parents"] if p["layer"] == "mul_1_3")
    assert (back_edge["out"], back_edge["in"], back_edge["args"]) == ("1-3", "2-4", ["arg 0"])


def test_statistics_match_torch_and_count_nan_and_inf():
    t = torch.tensor([[-2.0, 0.0, 3.0], [float("nan"), float("inf"), -float("inf")]])
    s = tensor_stats(t)
    finite = torch.tensor([-2.0, 0.0, 3.0], dtype=torch.float64)
    assert (s["numel"], s["nan"], s["inf"], s["zeros"]) == (6, 1, 2, pytest.approx(1 / 6))
    assert (s["min"], s["max"]) == (-2.0, 3.0)
    assert s["mean"] == pytest.approx(finite.mean().item()) and s["std"] == pytest.approx(finite.std(unbiased=False).item())
    assert sum(s["hist"]) == 3 and len(s["hist"]) == NUM_BINS


def test_statistics_of_odd_values():
    assert tensor_stats(torch.empty(0))["min"] is None
    assert tensor_stats(torch.full((4,), float("nan")))["nan"] == 4
    assert tensor_stats(torch.tensor([5, 5, 5]))["hist"] == [3]
    assert tensor_stats(torch.tensor([True, False, False]))["zeros"] == pytest.approx(2 / 3)
    assert tensor_stats(torch.tensor([3 + 4j]))["max"] == 5.0
    assert tensor_stats(torch.ones(3, dtype=torch.bfloat16))["mean"] == 1.0
    big = tensor_stats(torch.tensor([-1e308, 1e308], dtype=torch.float64))
    assert sum(big["hist"]) == 2 and all(math.isfinite(v) for v in (big["min"], big["max"]))
    assert tensor_stats("not a tensor") is None


def test_page_holds_statistics_not_tensors():
    torch.manual_seed(0)
    model = nn.Linear(512, 512)
    history = torchlog.log_forward_pass(model, torch.randn(64, 512))
    page = page_html(history)
    activations = sum(p.num_bytes for p in history)
    assert activations > 250_000
    vendored = len(page_html.__globals__["_asset"]("graphviz.js"))
    script = len(page_html.__globals__["viewer_script"]())  # the viewer's own code, any size
    assert len(page) - vendored - script < 60_000  # the two 128 KB activations are not in the page


def test_default_depth_is_the_deepest_readable_one():
    history = _nested()
    mode, depth = default_view(history, None, None)
    assert mode == "unrolled" and depth is None  # 17 nodes fully expanded: readable
    assert count_nodes(history, "unrolled", None) <= READABLE_NODES
    assert default_view(history, "rolled", 2) == ("rolled", 2)


class _Wide(nn.Module):
    """Twenty blocks of eight ops each: fully expanded it is too big to read."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(*[nn.Linear(4, 4) for _ in range(8)]) for _ in range(20))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def test_default_depth_collapses_a_large_model():
    history = torchlog.log_forward_pass(_Wide(), torch.randn(1, 4))
    mode, depth = default_view(history, None, None)
    assert (mode, depth) == ("unrolled", 1)  # 22 nodes at depth 1, 162 at depth 2
    assert count_nodes(history, "unrolled", 1) <= READABLE_NODES < count_nodes(history, "unrolled", 2)


def test_a_long_loop_opens_rolled_unless_asked_otherwise():
    history = torchlog.log_forward_pass(LongLoop(600), torch.randn(1, 4))
    assert default_view(history, None, None)[0] == "rolled"
    assert default_view(history, "unrolled", None)[0] == "unrolled"


def test_to_html_writes_one_offline_page(tmp_path):
    history = _nested()
    written = history.to_html(tmp_path / "nested.html", mode="rolled", depth=1)
    page = Path(written).read_text(encoding="utf-8")
    assert written == str(tmp_path / "nested.html")
    for needle in ("http://", "https://", "<script src", "<link "):
        assert needle not in page.replace("http://www.w3.org/", "")  # SVG namespace only
    data = json.loads(page.split('type="application/json">', 1)[1].split("</script>", 1)[0])
    assert data["view"] == {"mode": "rolled", "depth": 1}


def test_script_breaking_text_in_names_stays_inside_the_data(tmp_path):
    class Tricky(nn.Module):
        def forward(self, x):
            return x + 1

    Tricky.__name__ = "</script><script>alert(1)</script>"
    history = torchlog.log_forward_pass(Tricky(), torch.ones(1))
    page = page_html(history)
    assert page.count("</script>") == 3  # data, graphviz and viewer scripts only
    assert "<script>alert(1)" not in page


def test_bad_input_names_the_value(tmp_path):
    history = _nested()
    with pytest.raises(LogFileNotFoundError, match="no-such-folder"):
        history.to_html(tmp_path / "no-such-folder" / "page.html")
    with pytest.raises(InvalidOptionError, match="'sideways'"):
        history.to_html(tmp_path / "p.html", mode="sideways")
    with pytest.raises(InvalidOptionError, match="depth must be >= 1"):
        history.to_html(tmp_path / "p.html", depth=0)
    with pytest.raises(InvalidArgumentTypeError, match="'2'"):
        history.to_html(tmp_path / "p.html", depth="2")
    with pytest.raises(InvalidOptionError, match="is a folder"):
        history.to_html(tmp_path)
    with pytest.raises(InvalidArgumentTypeError, match="ModelHistory"):
        page_html({"not": "a history"})


def test_an_empty_history_is_refused_by_name(tmp_path):
    from torchlog.errors import TorchlogError
    from torchlog.history import ModelHistory, RunInfo

    empty = ModelHistory([], [], {}, RunInfo("Nothing", 0, 0.0, 0))
    with pytest.raises(TorchlogError, match="holds no ops") as caught:
        empty.to_html(tmp_path / "empty.html")
    assert "<ModelHistory of Nothing" in str(caught.value)
    assert not (tmp_path / "empty.html").exists()


def test_a_history_loaded_from_hdf5_opens_with_its_statistics(tmp_path):
    history = _nested()
    history.save(str(tmp_path / "run.h5"))
    loaded = torchlog.load(str(tmp_path / "run.h5"))
    fresh = _stable(page_data(history, "unrolled", None))
    again = _stable(page_data(loaded, "unrolled", None))
    assert again["passes"] == fresh["passes"] and again["calls"] == fresh["calls"]


def test_view_command_writes_the_page_and_reports_bad_files(tmp_path, capsys):
    from torchlog.__main__ import main

    _nested().save(str(tmp_path / "run.h5"))
    assert main(["view", str(tmp_path / "run.h5")]) == 0
    assert (tmp_path / "run.html").stat().st_size > 100_000
    assert f"wrote {tmp_path / 'run.html'}" in capsys.readouterr().out
    (tmp_path / "notes.h5").write_text("not hdf5")
    assert main(["view", str(tmp_path / "notes.h5")]) == 1
    assert "notes.h5" in capsys.readouterr().err


def test_vendored_files_match_their_recorded_versions():
    import importlib.util

    path = Path(torchlog.vis.viewer.__file__).parent / "vendor" / "refresh.py"
    spec = importlib.util.spec_from_file_location("refresh", path)
    refresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(refresh)
    assert refresh.check() == []
