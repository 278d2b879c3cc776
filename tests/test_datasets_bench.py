"""bench/datasets_bench.py runs on a few batches and prints its rows; no timing is asserted."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.heavy
def test_a_short_run_prints_throughput_ratios_and_memory_rows(tmp_path: Path) -> None:
    env = dict(os.environ, TRANSFORMERS_VERBOSITY="error")
    out = tmp_path / "datasets.txt"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "datasets_bench.py"), "--batches", "2",
                           "--rounds", "1", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]  # the bench also checks its mean and var against the loop's
    assert out.read_text() == done.stdout
    rows = [line for line in done.stdout.splitlines() if "ms/batch" in line]
    assert len(rows) == 6, done.stdout
    ratios = [float(row.split()[-1]) for row in rows]
    assert ratios[0] == 1.0 and min(ratios) > 0, rows  # the hand loop is its own baseline
    memory = [line for line in done.stdout.splitlines() if "batches +" in line]
    assert len(memory) == 2, done.stdout
    for line in memory:
        assert re.search(r"2 batches \+ *[\d.]+ MiB, 20 batches \+ *[\d.]+ MiB", line), line
