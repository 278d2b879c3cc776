"""bench/extract_bench.py --quick runs, prints its tables and matching arrays; no timing is asserted."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.heavy
def test_quick_run_prints_throughput_per_batch_costs_and_write_rates() -> None:
    env = dict(os.environ, TRANSFORMERS_VERBOSITY="error")
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "extract_bench.py"), "--quick"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    rows = [line for line in lines if line.startswith(("GPT-2", "CNN", "MLP"))]
    assert len(rows) == 3, done.stdout
    for row in rows:
        figures = row.split(")", 1)[1].split()
        plain, extract, ratio, fastest, full, full_ratio, worst = map(float, figures[:7])
        assert min(plain, extract, full, fastest) > 0 and abs(extract / plain - ratio) < 0.01, row
        assert worst == 0.0, row  # the arrays extract wrote are the plain loop's, exactly
    heads = [i for i, line in enumerate(lines) if line.startswith("Per batch beyond the forward pass, MLP")]
    assert len(heads) == 1 and lines[heads[0] + 1].count(" us") == 3, done.stdout
    layouts = [line.split()[0] for line in lines if "MB/s" in line]
    assert layouts == ["contiguous", "chunks", "gzip", "lzf"], done.stdout
    assert sum("of plain (medians; fastest runs" in line for line in lines) == 3
    assert sum("target 85%" in line for line in lines) == 1
