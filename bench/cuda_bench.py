"""Benchmark on a GPU (`bench/run.py --device cuda`): logging ratios of ResNet-50 and GPT-2.

Issue 16 asks for ResNet-50 (224x224) and GPT-2 (12 layers, hidden 768, sequence 128)
logging ratios on CUDA. Each model runs on the GPU under `torch.no_grad()`; a timed run
ends with `torch.cuda.synchronize()`, so GPU work queued by the run is counted. Three
timings per model, alternating: the plain forward, a log keeping values on the GPU
(`output_device='same'`), and a log copying them to pinned host memory
(`output_device='cpu'`, side-stream copies, capture/transfer.py). Medians after two
warm-up runs are reported; peak GPU memory comes from `torch.cuda.max_memory_allocated`.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable
from time import perf_counter
from typing import Any

import torch

from models import gpt2_small, resnet50  # bench/ is on sys.path (bench/run.py puts it there)

__all__ = ["cuda_cases", "measure_cuda", "format_cuda"]


def cuda_cases() -> dict[str, tuple[Callable[[], torch.nn.Module], Callable[[], torch.Tensor]]]:
    """Model and input builders by name; both are moved to the GPU by `measure_cuda`."""
    tokens = lambda: torch.randint(0, 1000, (1, 128), generator=torch.Generator().manual_seed(0))  # noqa: E731
    return {
        "ResNet-50 224x224": (resnet50, lambda: torch.randn(1, 3, 224, 224)),
        "GPT-2 (12 layers, hidden 768)": (lambda: gpt2_small(12, 768, 12), tokens),
    }


def _median_time(run: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(2 + repeats):
        torch.cuda.synchronize()
        start = perf_counter()
        kept = run()
        torch.cuda.synchronize()
        times.append(perf_counter() - start)
        del kept
    return statistics.median(times[2:])


def measure_cuda(repeats: int = 11) -> list[dict[str, Any]]:
    """One row per model: plain seconds, log seconds and ratio per output device, peak memory.

    Raises:
        RuntimeError: CUDA is not available on this machine.
    """
    import torchlog  # noqa: PLC0415

    if not torch.cuda.is_available():
        raise RuntimeError("bench/run.py --device cuda needs a CUDA GPU; torch.cuda.is_available() is False")
    rows = []
    for name, (build, make_input) in cuda_cases().items():
        model, x = build().cuda().eval(), make_input().cuda()
        row: dict[str, Any] = {"model": name}
        with torch.no_grad():
            row["plain_s"] = _median_time(lambda: model(x), repeats)
            for device in ("same", "cpu"):
                log = lambda: torchlog.log_forward_pass(model, x, output_device=device)  # noqa: E731
                torch.cuda.reset_peak_memory_stats()
                row[f"log_{device}_s"] = seconds = _median_time(log, repeats)
                row[f"ratio_{device}"] = seconds / row["plain_s"]
                row[f"peak_gpu_bytes_{device}"] = torch.cuda.max_memory_allocated()
        rows.append(row)
    return rows


def format_cuda(rows: list[dict[str, Any]]) -> str:
    """The rows as a plain-text table."""
    lines = [f"{'model':32} {'plain ms':>9} {'log ms':>9} {'ratio':>6} {'to cpu ms':>10} {'ratio':>6}"]
    for r in rows:
        lines.append(f"{r['model']:32} {r['plain_s'] * 1e3:9.2f} {r['log_same_s'] * 1e3:9.2f} "
                     f"{r['ratio_same']:6.2f} {r['log_cpu_s'] * 1e3:10.2f} {r['ratio_cpu']:6.2f}")
    return "\n".join(lines)
