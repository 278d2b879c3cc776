"""Peak memory of work on two HDF5 logs, measured in a fresh process: the runs the comparison
tests read pair by pair."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import torchlog

ROOT = Path(__file__).resolve().parents[3]


class Deep(nn.Module):
    """22 passes of 4 MB each for an input of 1M floats: 88 MB saved per run."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(10):
            x = x * 1.0001 + 1
        return x


# The start of a script run by `peak_of`: `reset_peak()` empties the peak resident set size and
# returns the resident set then; `status("VmHWM")` is the peak since. Big allocations are
# mmapped (a fixed threshold), so a freed value leaves the resident set instead of staying in
# malloc's heap for the next one.
PEAK_PRELUDE = textwrap.dedent("""
    import sys, torch, torchlog
    torch.set_num_threads(1)

    def status(key):
        return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1]) * 1024

    def reset_peak():
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        start = status("VmRSS")
        assert status("VmHWM") - start < 1 << 20, "the peak resident set size was not reset"
        return start
""")


def peak_of(script: str, tmp_path: Path) -> tuple[int, int, int, int]:
    """Log two runs of Deep (inputs 0.1% apart) and a tiny one to tmp_path/{a,b,tiny}.h5, run
    PEAK_PRELUDE + `script` on those paths (sys.argv[1:4]) in a fresh process, and return the
    two numbers it prints (a peak in bytes, a count), both runs' saved bytes and the largest
    pass's bytes."""
    pytest.importorskip("h5py")
    x = torch.rand(1 << 20)
    a = torchlog.log_forward_pass(Deep(), x, save_to=tmp_path / "a.h5")
    b = torchlog.log_forward_pass(Deep(), x * 1.001, save_to=tmp_path / "b.h5")
    torchlog.log_forward_pass(nn.Linear(2, 2), torch.ones(1, 2), save_to=tmp_path / "tiny.h5")
    both_runs, largest = a.num_saved_bytes + b.num_saved_bytes, max(p.num_bytes for p in a)
    del a, b
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(1 << 16))
    done = subprocess.run([sys.executable, "-c", PEAK_PRELUDE + textwrap.dedent(script),
                           *(str(tmp_path / f"{n}.h5") for n in ("a", "b", "tiny"))],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    peak, count = (int(v) for v in done.stdout.split())
    return peak, count, both_runs, largest
