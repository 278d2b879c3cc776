"""Interactive viewer figures: page build time in Python, HTML size, and in headless Chromium
the first view and expand times (not timed tests; issue 25's targets are printed beside them).

    .venv/bin/python bench/viewer_bench.py            # GPT-2 12 layers and a 20,000-op loop
    .venv/bin/python bench/viewer_bench.py --quick    # GPT-2 2 layers and a 2,000-op loop

For each history: ops, the page's HTML size, the median time of `page_html` over three builds
(and of its statistics alone), then in the browser the time from the start of navigation until
the default view is drawn (the page's own `performance.now()`: `first_open_ms` for the first
page of the browser session, `open_ms` the median of two more opens), the median layout and
drawing time of expanding one module (a block, then an attention inside it) from that view,
and of expanding every module. Results go to bench/results/viewer-<commit>-<machine>.{txt,json}.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "vis"))

import torchlog  # noqa: E402
from browser import open_page, run_and_wait, start_browser  # noqa: E402
from models import gpt2_small  # noqa: E402
from provenance import provenance, provenance_line  # noqa: E402
from torchlog.statistics import summarize_all  # noqa: E402
from torchlog.vis.viewer.page import page_html  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# Issue 25's targets, for the printed verdicts.
TARGETS = {"build_s (20,000 ops)": 5.0, "html_mb (GPT-2 12 layers)": 3.0,
           "open_ms (GPT-2 12 layers)": 1000.0, "expand_ms (GPT-2 12 layers)": 200.0}


class SteppedCell(nn.Module):
    """A recurrent cell stepped `steps` times: 4 ops and one module call per step."""

    def __init__(self, steps: int, width: int = 16) -> None:
        super().__init__()
        self.steps = steps
        self.cell = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for _ in range(self.steps):
            h = torch.tanh(self.cell(h)) * 0.5 + x
        return h


def machine() -> str:
    """'amd-epyc-2cores': the CPU model and the cores this process may use, for file names."""
    model = "unknown-cpu"
    with contextlib.suppress(OSError):
        found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        model = found[1] if found else model
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{re.sub(r'[^a-z0-9]+', '-', model.lower()).strip('-')}-{cores}cores"


def _cases(quick: bool) -> list[tuple[str, nn.Module, tuple]]:
    layers = 2 if quick else 12
    gpt = gpt2_small(num_layers=layers, hidden=256, num_heads=4)
    tokens = torch.randint(0, gpt.config.vocab_size, (1, 128))
    steps = 500 if quick else 5000
    return [(f"GPT-2 {layers} layers", gpt, (tokens,)),
            (f"{steps * 4} ops", SteppedCell(steps), (torch.randn(4, 16),))]


def build_times(history: torchlog.ModelHistory, repeats: int = 3) -> tuple[float, float, str]:
    """Median seconds of `page_html` and of the statistics alone, and the page."""
    values = [r.tensor_contents for r in history if r.saved is not None]
    stats_s, build_s, page = [], [], ""
    threads = torch.get_num_threads()
    for _ in range(repeats):
        torch.set_num_threads(1)  # as the page builds them
        started = time.perf_counter()
        summarize_all(values)
        stats_s.append(time.perf_counter() - started)
        torch.set_num_threads(threads)
        started = time.perf_counter()
        page = page_html(history)
        build_s.append(time.perf_counter() - started)
    return statistics.median(build_s), statistics.median(stats_s), page


def _expand(driver, module: str, repeats: int = 3) -> float | None:
    """Median layout and drawing time of opening `module` (an address) from the current
    view, closing it between tries; it is left open."""
    found = driver.execute_script(
        f"return Boolean(document.querySelector('#torchlog-graph g.node[data-module=\"{module}\"]'))")
    if not found:
        return None
    times = []
    for attempt in range(repeats):
        if attempt:
            run_and_wait(driver, f"await window.torchlogViewer.toggleModule({module!r});")  # close
        run_and_wait(driver, f"await window.torchlogViewer.toggleModule({module!r});")
        times.append(driver.execute_script("return window.torchlogViewer.timings.at(-1).ms"))
    return statistics.median(times)


def _open_times(driver, path: Path, repeats: int = 3) -> tuple[float, float]:
    """Milliseconds from navigation to the drawn default view: the first open in this
    browser session, and the median of the next ones (compiled WebAssembly cached)."""
    times = []
    for _ in range(repeats):
        driver.get("about:blank")
        open_page(driver, path, timeout_s=600)
        times.append(driver.execute_script("return window.torchlogViewer.openedMs"))
    return times[0], statistics.median(times[1:])


def measure(name: str, model: nn.Module, inputs: tuple, driver, folder: Path) -> dict:
    history = torchlog.log_forward_pass(model, inputs, random_seed=0)
    build_s, stats_s, page = build_times(history)
    path = folder / "page.html"
    path.write_text(page, encoding="utf-8")
    first_ms, open_ms = _open_times(driver, path)
    viewer = "window.torchlogViewer"
    row = {"history": name, "ops": len(history), "html_mb": len(page.encode()) / 2**20,
           "build_s": build_s, "stats_s": stats_s, "first_open_ms": first_ms, "open_ms": open_ms,
           "open_nodes": driver.execute_script(f"return {viewer}.timings.at(-1).nodes"),
           "mode": driver.execute_script(f"return {viewer}.state.mode"),
           "depth": driver.execute_script(f"return {viewer}.state.depth")}
    if name.startswith("GPT-2"):
        row["expand_block_ms"] = _expand(driver, "transformer.h.2")
        row["expand_attention_ms"] = _expand(driver, "transformer.h.2.attn")
    run_and_wait(driver, f"await {viewer}.setDepth(1000);", timeout_s=600)
    last = driver.execute_script(f"return {viewer}.timings.at(-1)")
    row["all_nodes"], row["expand_all_ms"] = last["nodes"], last["ms"]
    return row


def verdicts(rows: list[dict]) -> list[str]:
    gpt = next((r for r in rows if r["history"] == "GPT-2 12 layers"), None)
    big = next((r for r in rows if r["history"] == "20000 ops"), None)
    expands = [v for v in ((gpt or {}).get("expand_block_ms"), (gpt or {}).get("expand_attention_ms")) if v]
    found = {"build_s (20,000 ops)": big and big["build_s"],
             "html_mb (GPT-2 12 layers)": gpt and gpt["html_mb"],
             "open_ms (GPT-2 12 layers)": gpt and gpt["open_ms"],
             "expand_ms (GPT-2 12 layers)": max(expands, default=None)}
    return [f"{'ok' if value <= TARGETS[key] else 'OVER'}: {key} {value:.3g} (target <= {TARGETS[key]:g})"
            for key, value in found.items() if value]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-save", action="store_true", help="print only, write no result file")
    args = parser.parse_args()
    torch.manual_seed(0)
    lines = [provenance_line(),
             f"# machine: {machine()}, {platform.machine()}, {platform.platform()}, torch {torch.__version__}"]
    driver = start_browser()
    lines.append(f"# browser: {driver.capabilities.get('browserName')} {driver.capabilities.get('browserVersion')}")
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name, model, inputs in _cases(args.quick):
                rows.append(measure(name, model.eval(), inputs, driver, Path(tmp)))
                lines.append(" | ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                        for k, v in rows[-1].items()))
                print(lines[-1], flush=True)
    finally:
        driver.quit()
    lines += verdicts(rows)
    print("\n".join(lines[-len(verdicts(rows)):]) if verdicts(rows) else "")
    if not args.no_save and not args.quick:
        stem = RESULTS / f"viewer-{provenance()['commit']}-{machine()}"
        stem.with_suffix(".txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        stem.with_suffix(".json").write_text(json.dumps({"provenance": provenance(), "rows": rows},
                                                        indent=1) + "\n", encoding="utf-8")
        print(f"wrote {stem}.txt and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
