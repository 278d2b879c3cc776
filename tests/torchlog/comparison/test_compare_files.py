"""torchlog.compare on histories opened from HDF5: the same rows as in memory, read pair by pair."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

import torchlog
from tests.torchlog.comparison.memory_peaks import peak_of
from tests.torchlog.comparison.test_compare import Mlp, NanInBlockOne
from torchlog.comparison import first_nonfinite

pytest.importorskip("h5py")


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
    assert first_nonfinite(torchlog.load(tmp_path / "nan.h5")).label == "log_1_4"


def test_peak_memory_of_comparing_two_files_is_a_few_passes(tmp_path: Path) -> None:
    # Opens two logs, compares two tiny runs to load every library, then compares the logs.
    peak, num_differ, both_runs, largest = peak_of("""
        a, b = torchlog.load(sys.argv[1]), torchlog.load(sys.argv[2])
        tiny = torchlog.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2))
        torchlog.compare(tiny, torchlog.load(sys.argv[3]))
        start = reset_peak()
        comparison = torchlog.compare(a, b)
        print(status("VmHWM") - start, comparison.counts["differs"])
    """, tmp_path)
    assert num_differ == 22  # the input differs, and so does every op after it
    assert peak < both_runs / 4, f"peak {peak} B while comparing runs of {both_runs} B"
    assert peak <= 4 * largest, f"peak {peak} B: more than 4 passes of {largest} B"
