"""What transparent huge pages do to logging a model whose saved activations are large.

Run `.venv/bin/python bench/hugepages.py` (add `--repeats N`, `--json PATH`; `--quick`: a smoke run).

Logging keeps every activation alive, so the allocator cannot hand an op the memory the
previous op just freed, as it does in a plain forward pass: each saved byte lands on a
fresh page, and the kernel takes a page fault (and zeroes 4 KiB) for every one of them.
On ResNet-50 at 224x224 that is about 33,000 faults per pass, most of what logging adds
over the plain forward. glibc 2.35 and later can back its heap and its mmap'd chunks with
2 MiB transparent huge pages (`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`), which cuts the
faults about 500-fold. The setting is read once, when the process starts, so it cannot
be switched on from inside a running interpreter: this script measures ResNet-50 in two
child processes, one with the default environment and one with the tunable, each
timing plain and logged passes alternately (CPU clock, 1 thread, under torch.no_grad(),
medians) and counting the minor page faults of each logged pass (median). glibc keeps
some freed memory for reuse and gives some back to the kernel, depending on its history,
so the faults of a pass vary from run to run; a one-off log of a large model in a fresh
process takes them all.

On Linux the kernel's THP mode must be `madvise` or `always`
(/sys/kernel/mm/transparent_hugepage/enabled); with `never` both rows match.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

TUNABLE = "glibc.malloc.hugetlb=1"
_CHILD = """
import json, resource, statistics, sys, time
sys.path.insert(0, {bench!r})
import torch
torch.set_num_threads(1)
import torchlog
from models import resnet50
model, x = resnet50(), torch.randn(1, 3, {size}, {size})
plain, logged, faults = [], [], []
with torch.no_grad():
    model(x); torchlog.log_forward_pass(model, x)  # warm-up
    for _ in range({repeats}):
        t = time.process_time(); model(x); plain.append(time.process_time() - t)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t = time.process_time(); history = torchlog.log_forward_pass(model, x)
        logged.append(time.process_time() - t)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        del history
print(json.dumps({{"plain_ms": statistics.median(plain) * 1e3, "log_ms": statistics.median(logged) * 1e3,
                  "faults": statistics.median(faults)}}))
"""


def measure(tunable: bool, repeats: int, size: int = 224) -> dict:
    """Plain and logged median ms and the median page faults of a logged pass, in a child process."""
    env = dict(os.environ)
    env.pop("GLIBC_TUNABLES", None)
    if tunable:
        env["GLIBC_TUNABLES"] = TUNABLE
    bench = str(Path(__file__).resolve().parent)
    done = subprocess.run([sys.executable, "-c", _CHILD.format(bench=bench, repeats=repeats, size=size)],
                          capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the child process failed:\n{done.stderr[-3000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    figures["ratio"] = figures["log_ms"] / figures["plain_ms"]
    return figures


def _thp_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "unknown (no /sys/kernel/mm/transparent_hugepage)"
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else text.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed plain and logged passes per child")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--quick", action="store_true", help="a 64x64 input and one repeat: a smoke run")
    args = parser.parse_args()
    repeats, size = (1, 64) if args.quick else (args.repeats, 224)
    rows = {"default": measure(False, repeats, size), TUNABLE: measure(True, repeats, size)}
    print(f"ResNet-50 {size}x{size}, every layer saved; kernel THP mode: {_thp_mode()}")
    print(f"{'environment':<28} {'plain ms':>9} {'log ms':>9} {'ratio':>6} {'faults per log':>15}")
    for name, row in rows.items():
        print(f"{name:<28} {row['plain_ms']:>9.1f} {row['log_ms']:>9.1f} {row['ratio']:>6.2f} "
              f"{row['faults']:>15,}")
    if args.json:
        Path(args.json).write_text(json.dumps({"thp_mode": _thp_mode(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
