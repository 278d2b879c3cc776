"""bench/extract_bench.py --quick runs, prints its two tables and matching arrays; no timing is asserted."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.heavy
def test_quick_run_prints_throughput_and_write_rates() -> None:
    env = dict(os.environ, TRANSFORMERS_VERBOSITY="error")
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "extract_bench.py"), "--quick"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    rows = [line for line in lines if line.startswith(("GPT-2", "CNN"))]
    assert len(rows) == 2, done.stdout
    for row in rows:
        figures = row.split(")", 1)[1].split()
        plain, extract, ratio, full, full_ratio, worst = map(float, figures[:6])
        assert min(plain, extract, full) > 0 and abs(extract / plain - ratio) < 0.01, row
        assert worst == 0.0, row  # the arrays extract wrote are the plain loop's, exactly
    layouts = [line.split()[0] for line in lines if "MB/s" in line]
    assert layouts == ["contiguous", "chunks", "gzip", "lzf"], done.stdout
    assert sum("of plain (target 80%)" in line for line in lines) == 2
