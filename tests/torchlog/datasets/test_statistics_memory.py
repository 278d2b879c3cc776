"""Statistics over a dataset too large to hold: the peak memory of the process, measured, stays
far below the size of the site's values, and the result equals a float64 numpy oracle that
recomputes each batch with the plain model."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.heavy

# One process: the peak resident set (ru_maxrss) after a warm-up run, then after a run over
# NUM_BATCHES batches whose site values total TOTAL_MB; the oracle streams the same batches
# through the plain model into float64 numpy sums.
SCRIPT = textwrap.dedent("""
    import json, resource, sys
    import numpy as np, torch
    from torch import nn
    from torchlog.datasets import statistics

    torch.set_num_threads(1)
    num_batches, rows, width = int(sys.argv[1]), 512, 1024
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, width), nn.ReLU())

    def batches(count):
        for index in range(count):
            yield torch.randn(rows, 64, generator=torch.Generator().manual_seed(index))

    def peak_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    statistics(model, batches(3), ["0"], stats=["mean", "var", "max"], progress=False)
    before = peak_mb()
    found = statistics(model, batches(num_batches), ["0"], stats=["mean", "var", "max", "zeros"],
                       progress=False)
    grown = peak_mb() - before
    total, squares, largest, zeros = np.zeros(width), np.zeros(width), np.full(width, -np.inf), np.zeros(width)
    with torch.no_grad():
        for batch in batches(num_batches):
            values = model[0](batch).double().numpy()
            total += values.sum(axis=0)
            squares += (values ** 2).sum(axis=0)
            largest = np.maximum(largest, values.max(axis=0))
    count = num_batches * rows
    mean = total / count
    site = found["0"]
    print(json.dumps({
        "grown_mb": grown, "total_mb": count * width * 4 / 2 ** 20, "count": site.count,
        "mean_error": float(np.abs(site.mean.numpy() - mean).max()),
        "var_error": float(np.abs(site.var.numpy() - (squares / count - mean ** 2)).max()),  # numpy's ddof=0
        "max_equal": bool(np.array_equal(site.max.numpy(), largest)),
        "rows": count,
    }))
""")


def test_peak_memory_stays_far_below_the_values_of_the_dataset() -> None:
    num_batches = 240  # 240 batches x 2 MiB of values at the site: 480 MiB in all
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(num_batches)], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["count"] == found["rows"] == num_batches * 512
    assert found["total_mb"] == pytest.approx(480.0)
    assert found["grown_mb"] < found["total_mb"] / 8, found  # not held: a few batches at most
    assert found["mean_error"] < 1e-9 and found["var_error"] < 1e-9, found
    assert found["max_equal"]
