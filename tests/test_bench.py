"""bench/run.py --quick runs and prints its table; no timing is asserted (timings vary by machine)."""
from __future__ import annotations

import importlib.util
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
def quick_output() -> str:
    env = dict(os.environ, TRANSFORMERS_VERBOSITY="error")
    argv = [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--threads", "1",
            "--torchlens-python", str(ROOT / "bench" / "no-such-python")]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def test_quick_run_prints_one_row_per_model(quick_output: str):
    lines = quick_output.splitlines()
    header = next(line for line in lines if line.startswith("model "))
    assert header.split() == ["model", "ops", "plain", "ms", "log", "ms", "ratio", "us/op", "saved", "MB",
                              "+peak", "MB", "budget", "MB"]
    for case in quick_cases():
        row = next((line for line in lines if line.startswith(case.name + " ")), None)
        assert row is not None, f"no row for {case.name!r} in:\n{quick_output}"
        figures = row[len(case.name):].split()
        assert len(figures) == 8, row
        values = [float(f) for f in figures]  # every cell is a number (memory was measured)
        model, inputs = case.build(), case.make_input()
        assert int(values[0]) == len(torchlog.log_forward_pass(model, inputs)), row
        plain, log, ratio = values[1:4]
        assert plain > 0 and log > 0, row
        # The ratio is log/plain before rounding; the times are printed to 0.05 ms.
        assert (log - 0.05) / (plain + 0.05) - 0.005 <= ratio <= (log + 0.05) / max(plain - 0.05, 1e-9) + 0.005, row


def test_quick_run_checks_targets_and_reports_missing_torchlens(quick_output: str):
    targets = quick_output.split("Targets:")[1].splitlines()
    checked = [line.split()[0] for line in targets if ": us/op " in line]
    assert len(checked) == len(quick_cases()) and set(checked) <= {"ok", "OVER"}
    assert "TorchLens: not installed (" in quick_output
