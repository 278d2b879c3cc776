"""bench/run.py --quick runs and prints its table; no timing is asserted (timings vary by machine)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import torchlog

ROOT = Path(__file__).resolve().parent.parent


def _bench_models():
    # Loaded under its own name: putting bench/ on sys.path would shadow other `models`.
    spec = importlib.util.spec_from_file_location("bench_models", ROOT / "bench" / "models.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_models"] = module  # dataclasses look their module up while it runs
    spec.loader.exec_module(module)
    return module


quick_cases = _bench_models().quick_cases


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    env = dict(os.environ, TRANSFORMERS_VERBOSITY="error")
    json_path = tmp_path_factory.mktemp("bench") / "quick.json"
    argv = [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--threads", "1", "--clock", "cpu",
            "--torchlens-python", str(ROOT / "bench" / "no-such-python"), "--json", str(json_path)]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout, json.loads(json_path.read_text())


@pytest.fixture(scope="module")
def quick_output(quick_run: tuple[str, dict]) -> str:
    return quick_run[0]


def test_quick_run_prints_one_row_per_model(quick_output: str):
    lines = quick_output.splitlines()
    header = next(line for line in lines if line.startswith("model "))
    assert header.split() == ["model", "ops", "calls", "plain", "ms", "log", "ms", "ratio", "us/op", "saved",
                              "MB", "+peak", "MB", "held", "MB", "held", "max", "MB"]
    for case in quick_cases():
        row = next((line for line in lines if line.startswith(case.name + " ")), None)
        assert row is not None, f"no row for {case.name!r} in:\n{quick_output}"
        figures = row[len(case.name):].split()
        assert len(figures) == 10, row
        values = [float(f) for f in figures]  # every cell is a number (memory was measured)
        model, inputs = case.build(), case.make_input()
        assert int(values[0]) == len(torchlog.log_forward_pass(model, inputs)), row
        assert values[1] >= 1, row  # the root module's call at least
        plain, log, ratio = values[2:5]
        assert plain > 0 and log > 0, row
        # The ratio is log/plain before rounding; the times are printed to 0.0005 ms.
        e = 0.0005
        assert (log - e) / (plain + e) - 0.005 <= ratio <= (log + e) / max(plain - e, 1e-9) + 0.005, row


def test_quick_run_checks_targets_and_reports_missing_torchlens(quick_output: str):
    targets = quick_output.split("Targets (")[1].splitlines()
    per_call = [line.split()[0] for line in targets if ": us per call " in line]
    assert len(per_call) == 2 and set(per_call) <= {"ok", "OVER"}
    held = [line for line in targets if ": held MB " in line]
    assert len(held) == len(quick_cases())
    assert any(": us per module call " in line for line in targets)
    assert "Per submodule never called (" in quick_output
    assert "TorchLens: not installed (" in quick_output


def test_quick_run_writes_every_figure_as_json(quick_run: tuple[str, dict]):
    _, figures = quick_run
    assert [r["name"] for r in figures["torchlog"]] == [c.name for c in quick_cases()]
    assert figures["per_call"]["linear_us"] == pytest.approx(
        figures["per_call"]["linear_log_us"] - figures["per_call"]["linear_plain_us"])
    assert figures["torchlens"].startswith("not installed (")
    assert {"date", "commit", "uptime", "command"} <= set(figures["setting"])
    assert isinstance(figures["per_call"]["us_per_uncalled_module"], float)


def test_compare_reads_two_json_runs(quick_run: tuple[str, dict], tmp_path: Path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(quick_run[1]))
    argv = [sys.executable, str(ROOT / "bench" / "compare.py"), str(path), str(path)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "->" in line]
    assert len(rows) == len(quick_cases())
    assert "per call, Linear(8, 8) on (2, 8)" in done.stdout
    assert "per submodule never called" in done.stdout


@pytest.fixture(scope="module")
def breakdown_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    json_path = tmp_path_factory.mktemp("breakdown") / "quick.json"
    argv = [sys.executable, str(ROOT / "bench" / "breakdown.py"), "--quick", "--json", str(json_path)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout, json.loads(json_path.read_text())


def test_breakdown_quick_prints_every_category_per_model(breakdown_run: tuple[str, dict]):
    """bench/breakdown.py --quick: one row per model, every cell a number; no timing is asserted."""
    output, figures = breakdown_run
    lines = output.splitlines()
    header = next(line for line in lines if line.startswith("model "))
    assert header.split() == ["model", "ops", "calls", "plain", "ms", "total", "mode", "parents", "site",
                              "modules", "nodes", "saving", "group", "assemble", "history", "set-up", "sum",
                              "resid", "IQR", "us/call", "own", "set-up"]
    for case in quick_cases():
        row = next((line for line in lines if line.startswith(case.name + " ")), None)
        assert row is not None, f"no row for {case.name!r} in:\n{output}"
        assert len([float(f) for f in row[len(case.name):].split()]) == 19, row
    assert "per call, Linear(8, 8) on (2, 8)" in output
    assert [r["name"] for r in figures["models"]] == [c.name for c in quick_cases()]
    for row in figures["models"]:
        assert set(row["us_per_op"]) == set(figures["categories"])
        # The printed sum is the sum of the printed categories; the residual is what is left.
        assert row["sum_us_per_op"] == pytest.approx(sum(row["us_per_op"].values()))
        assert row["residual_us_per_op"] == pytest.approx(row["total_us_per_op"] - row["sum_us_per_op"])


_RESTORE_CHECK = """
import sys
sys.argv = ["breakdown.py"]
sys.path.insert(0, "bench")
import breakdown, torchlog.api
from torchlog.capture import call_sites, functionals, recorder, run
def now():
    return (recorder.call_site, functionals.call_site, recorder.Recorder.enter, recorder.Recorder.leave, recorder.Recorder.leave_raised,
            recorder.Recorder._find_parents, torchlog.api._capture, torchlog.api._build, run._run_recorded)
before = now()
patches = (breakdown._NO_SITE + breakdown._NO_MODULES + breakdown._PhaseClock().patches()
           + breakdown._ParentTimer().patches())
try:
    with breakdown._patched(patches):
        assert recorder.call_site is not call_sites.call_site
        raise RuntimeError("leave the block")
except RuntimeError:
    pass
assert now() == before, "not restored"
print("restored")
"""


def test_breakdown_restores_what_it_patched():
    # In a child: importing bench/breakdown.py puts bench/ on sys.path, which would shadow `models`.
    done = subprocess.run([sys.executable, "-c", _RESTORE_CHECK], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "restored" in done.stdout, done.stderr[-4000:]


def _run_script(name: str, tmp_path: Path) -> dict:
    json_path = tmp_path / f"{name}.json"
    argv = [sys.executable, str(ROOT / "bench" / f"{name}.py"), "--quick", "--json", str(json_path)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(json_path.read_text())


def test_repeated_quick_times_each_model_in_a_loop(tmp_path: Path):
    """bench/repeated.py --quick: a row per model with its logged and plain ms; no timing asserted."""
    figures = _run_script("repeated", tmp_path)
    assert set(figures["rows"]) == {"Linear(8, 8) on (2, 8)", "SimpleRecurrent (seed)"}
    for row in figures["rows"].values():
        assert row["log_ms"] > 0 and row["plain_ms"] > 0


def test_hugepages_quick_measures_both_environments(tmp_path: Path):
    """bench/hugepages.py --quick: both child processes ran and counted their page faults."""
    figures = _run_script("hugepages", tmp_path)
    assert set(figures["rows"]) == {"default", "glibc.malloc.hugetlb=1"}
    for row in figures["rows"].values():
        assert row["plain_ms"] > 0 and row["log_ms"] > 0 and row["faults"] >= 0
        assert row["ratio"] == pytest.approx(row["log_ms"] / row["plain_ms"])


def test_floor_quick_prints_both_tables(tmp_path: Path):
    json_path = tmp_path / "floor.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "floor.py"), "--quick", "--json", str(json_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    figures = json.loads(json_path.read_text())
    assert {r["call"] for r in figures["calls"]} >= {"torch.add (C function)", "F.layer_norm (Python functional)"}
    assert all(r["mode_us"] > 0 and r["plain_us"] > 0 for r in figures["calls"])
    rows = {r["name"]: r for r in figures["models"]}
    assert set(rows) == {case.name for case in quick_cases()}
    for case in quick_cases():
        row = rows[case.name]
        assert row["ops"] == len(torchlog.log_forward_pass(case.build(), case.make_input())), row
        assert row["mode_calls_per_op"] > 0 and 0 <= row["python_functionals_per_op"] <= row["mode_calls_per_op"], row
        assert f"{case.name} " in done.stdout
