"""torchlog.compare on histories opened from HDF5: the same rows as in memory, read pair by pair."""
from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import torchlog
from tests.torchlog.comparison.test_compare import Mlp, NanInBlockOne

pytest.importorskip("h5py")

ROOT = Path(__file__).resolve().parents[3]


def test_files_give_the_comparison_made_in_memory(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, x = Mlp(), torch.randn(3, 8)
    changed = copy.deepcopy(model)
    with torch.no_grad():
        changed.fc1.weight[0, 0] += 1e-3
    a = torchlog.log_forward_pass(model, x, save_to=tmp_path / "a.h5")
    b = torchlog.log_forward_pass(changed, x, save_to=tmp_path / "b.h5")
    in_memory = torchlog.compare(a, b)
    on_disk = torchlog.compare(torchlog.load(tmp_path / "a.h5"), torchlog.load(tmp_path / "b.h5"))
    assert [(r.label_a, r.label_b, r.status) for r in on_disk] == \
        [(r.label_a, r.label_b, r.status) for r in in_memory]
    for disk, memory in zip(on_disk, in_memory):
        assert disk.diff == pytest.approx(memory.diff, rel=1e-12)
    assert on_disk.first_divergence.label_a == in_memory.first_divergence.label_a == "linear_1_1"
    assert torchlog.compare(a, torchlog.load(tmp_path / "b.h5")).counts == in_memory.counts


def test_first_nonfinite_of_a_file(tmp_path: Path) -> None:
    torch.manual_seed(0)
    torchlog.log_forward_pass(NanInBlockOne(), torch.randn(2, 4), save_to=tmp_path / "nan.h5")
    assert torchlog.load(tmp_path / "nan.h5").first_nonfinite().label == "log_1_4"


class Deep(nn.Module):
    """22 passes of 4 MB each for an input of 1M floats: 88 MB saved per run."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(10):
            x = x * 1.0001 + 1
        return x


# Opens two logs, compares two tiny runs to load every library, resets the peak resident set
# size and compares the logs. Big allocations are mmapped (a fixed threshold), so a freed
# value leaves the resident set instead of staying in malloc's heap for the next one.
_PEAK_SCRIPT = textwrap.dedent("""
    import sys, torch, torchlog
    torch.set_num_threads(1)

    def status(key):
        return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1]) * 1024

    a, b = torchlog.load(sys.argv[1]), torchlog.load(sys.argv[2])
    tiny = torchlog.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2))
    torchlog.compare(tiny, torchlog.load(sys.argv[3]))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    start = status("VmRSS")
    assert status("VmHWM") - start < 1 << 20, "the peak resident set size was not reset"
    comparison = torchlog.compare(a, b)
    print(status("VmHWM") - start, comparison.counts["differs"])
""")


def test_peak_memory_of_comparing_two_files_is_a_few_passes(tmp_path: Path) -> None:
    x = torch.rand(1 << 20)
    a = torchlog.log_forward_pass(Deep(), x, save_to=tmp_path / "a.h5")
    b = torchlog.log_forward_pass(Deep(), x * 1.001, save_to=tmp_path / "b.h5")
    torchlog.log_forward_pass(nn.Linear(2, 2), torch.ones(1, 2), save_to=tmp_path / "tiny.h5")
    both_runs, largest = a.num_saved_bytes + b.num_saved_bytes, max(p.num_bytes for p in a)
    del a, b
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(1 << 16))
    done = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, *(str(tmp_path / f"{n}.h5") for n in "ab"),
                           str(tmp_path / "tiny.h5")], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    peak, num_differ = (int(v) for v in done.stdout.split())
    assert num_differ == 22, done.stdout  # the input differs, and so does every op after it
    assert peak < both_runs / 4, f"peak {peak} B while comparing runs of {both_runs} B"
    assert peak <= 4 * largest, f"peak {peak} B: more than 4 passes of {largest} B"
