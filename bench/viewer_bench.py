"""Interactive viewer figures: page build time in Python, HTML size, and in headless Chromium
the first view, its readability and expand times (not timed tests; the targets are printed
beside them).

    .venv/bin/python bench/viewer_bench.py            # GPT-2 12 layers, a ResNet-18, a 20,000-op loop
    .venv/bin/python bench/viewer_bench.py --quick    # GPT-2 2 layers, the ResNet, a 2,000-op loop

For each history: ops, the page's HTML size, the median time of `page_html` over three builds
(and of its statistics alone), then in the browser the time from the start of navigation until
the default view is drawn (the page's own `performance.now()`: `first_open_ms` for the first
page of the browser session, `open_ms` the median of two more opens), the smallest on-screen
height of a module's title in that view (`min_title_px`: every drawn module box or node, its
largest displayed title), the median layout and drawing time of expanding one module (a block,
then an attention inside it) from that view and of expanding one at about 400 nodes
(`expand_400_ms`), and of expanding every module, with the longest main-thread task the Long
Tasks API saw meanwhile (`expand_all_longest_task_ms`; the layout runs in a worker). For the
loop, whether its unrolled view is drawn or refused. Results go to
bench/results/viewer-open-expand-<commit>-<machine>.{txt,json}.
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
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.vis: the ResNet-18 of the tests

import torchlog  # noqa: E402
from browser import open_page, run_and_wait, start_browser  # noqa: E402
from models import gpt2_small  # noqa: E402
from tests.vis.test_viewer_first_view import SmallResNet  # noqa: E402
from provenance import provenance, provenance_line  # noqa: E402
from torchlog.statistics import summarize_all  # noqa: E402
from torchlog.vis.viewer.page import page_html  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# The targets, for the printed verdicts (min_title_px is a floor, the others ceilings).
TARGETS = {"build_s (20,000 ops)": 5.0, "html_mb (GPT-2 12 layers)": 3.0, "html_mb (20,000 ops)": 15.0,
           "open_ms (GPT-2 12 layers)": 1000.0, "expand_ms (GPT-2 12 layers)": 200.0,
           "expand_400_ms (GPT-2 12 layers)": 200.0, "expand_all_longest_task_ms (GPT-2 12 layers)": 200.0,
           "min_title_px (GPT-2 12 layers)": 8.0, "min_title_px (ResNet-18)": 8.0}
FLOORS = {"min_title_px (GPT-2 12 layers)", "min_title_px (ResNet-18)"}
# The smallest on-screen height (px) of a drawn module's largest displayed title.
MIN_TITLE_PX = """
const sizes = [...document.querySelectorAll('#torchlog-graph [data-module]')].map(g => Math.max(0,
  ...[...g.querySelectorAll(':scope > text')].filter(t => getComputedStyle(t).display !== 'none' && t.textContent.trim())
     .map(t => t.getBoundingClientRect().height)));
return sizes.length ? Math.min(...sizes) : null;"""
LONG_TASKS = ("window.benchLongTasks = []; new PerformanceObserver((list) => list.getEntries()"
              ".forEach((e) => window.benchLongTasks.push(e.duration))).observe({type: 'longtask'});")


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
            ("ResNet-18", SmallResNet(width=16), (torch.randn(1, 3, 64, 64),)),
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


# The collapsed module (not plumbing) holding the most ops, or null.
COLLAPSED = """
const units = window.torchlogViewer.state.drawn.placed.units;
const keys = [...document.querySelectorAll('#torchlog-graph g.node[data-expanded="false"]:not([data-plumbing])')]
  .map(g => g.dataset.key).sort((a, b) => units.get(b).members.length - units.get(a).members.length);
return keys.length ? keys[0].slice('module '.length) : null;"""


def _expand_at(driver, nodes: int) -> tuple[int, float, float] | None:
    """The layout and drawing time of expanding one module from the deepest depth that still
    has a collapsed module, going no deeper once a view has `nodes` nodes: (nodes after, ms,
    of which the layout, in the worker, ms)."""
    viewer = "window.torchlogViewer"
    best = None
    for depth in range(1, 12):
        run_and_wait(driver, f"await {viewer}.setDepth({depth});", timeout_s=600)
        if driver.execute_script(COLLAPSED) is None:
            break
        best = depth
        if driver.execute_script(f"return {viewer}.timings.at(-1).nodes") >= nodes:
            break
    if best is None:
        return None
    run_and_wait(driver, f"await {viewer}.setDepth({best});", timeout_s=600)
    module = driver.execute_script(COLLAPSED)
    run_and_wait(driver, f"await {viewer}.toggleModule({module!r});", timeout_s=600)
    last = driver.execute_script(f"return {viewer}.timings.at(-1)")
    return last["nodes"], last["ms"], last["layoutMs"]


def _expand_all(driver) -> tuple[int, float, float]:
    """Nodes, time and the longest main-thread task (Long Tasks API) of expanding every module."""
    driver.execute_script(LONG_TASKS)
    run_and_wait(driver, "document.getElementById('torchlog-expand-all').click();", timeout_s=600)
    driver.execute_script("return new Promise((r) => setTimeout(r, 100))")
    last = driver.execute_script("return window.torchlogViewer.timings.at(-1)")
    return last["nodes"], last["ms"], max(driver.execute_script("return window.benchLongTasks"), default=0.0)


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
           "depth": driver.execute_script(f"return {viewer}.state.depth"),
           "min_title_px": driver.execute_script(MIN_TITLE_PX)}
    if name.startswith("GPT-2"):
        run_and_wait(driver, f"await {viewer}.setRepeats(false);")  # the blocks one by one
        row["expand_block_ms"] = _expand(driver, "transformer.h.2")
        row["expand_attention_ms"] = _expand(driver, "transformer.h.2.attn")
        open_page(driver, path, timeout_s=600)
        row["expand_400_nodes"], row["expand_400_ms"], row["expand_400_layout_ms"] = \
            _expand_at(driver, 400) or (None, None, None)
        open_page(driver, path, timeout_s=600)
    if name.endswith("ops"):
        open_page(driver, folder / _unrolled_page(history, folder), timeout_s=600)
        message = driver.find_element("id", "torchlog-graph").text
        row["unrolled"] = ("drawn" if driver.execute_script("return Boolean(window.torchlogViewer.state.drawn)")
                           else "refused" if "not offered" in message else "asks first")
        open_page(driver, path, timeout_s=600)
    row["all_nodes"], row["expand_all_ms"], row["expand_all_longest_task_ms"] = _expand_all(driver)
    return row


def _unrolled_page(history: torchlog.ModelHistory, folder: Path) -> str:
    """The history's page opened unrolled with every module open (file name in `folder`)."""
    max_depth = max(len(r.containing_modules) for r in history) + 1
    (folder / "unrolled.html").write_text(page_html(history, mode="unrolled", depth=max_depth), encoding="utf-8")
    return "unrolled.html"


def verdicts(rows: list[dict]) -> list[str]:
    gpt = next((r for r in rows if r["history"] == "GPT-2 12 layers"), {})
    big = next((r for r in rows if r["history"] == "20000 ops"), {})
    resnet = next((r for r in rows if r["history"] == "ResNet-18"), {})
    expands = [v for v in (gpt.get("expand_block_ms"), gpt.get("expand_attention_ms")) if v]
    found = {"build_s (20,000 ops)": big.get("build_s"), "html_mb (20,000 ops)": big.get("html_mb"),
             "html_mb (GPT-2 12 layers)": gpt.get("html_mb"), "open_ms (GPT-2 12 layers)": gpt.get("open_ms"),
             "expand_ms (GPT-2 12 layers)": max(expands, default=None),
             "expand_400_ms (GPT-2 12 layers)": gpt.get("expand_400_ms"),
             "expand_all_longest_task_ms (GPT-2 12 layers)": gpt.get("expand_all_longest_task_ms"),
             "min_title_px (GPT-2 12 layers)": gpt.get("min_title_px"),
             "min_title_px (ResNet-18)": resnet.get("min_title_px")}
    lines = []
    for key, value in found.items():
        if value is None:
            continue
        floor = key in FLOORS
        good = value >= TARGETS[key] if floor else value <= TARGETS[key]
        lines.append(f"{'ok' if good else 'MISSED'}: {key} {value:.3g} (target {'>=' if floor else '<='} {TARGETS[key]:g})")
    if big:
        lines.append(f"{'ok' if big.get('unrolled') != 'asks first' else 'MISSED'}: unrolled view of 20,000 ops "
                     f"{big.get('unrolled')} (target: drawn or refused)")
    return lines


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
        commit = provenance()["commit"].replace("+", "-")
        stem = RESULTS / f"viewer-open-expand-{commit}-{machine()}"
        stem.with_suffix(".txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        stem.with_suffix(".json").write_text(json.dumps({"provenance": provenance(), "rows": rows},
                                                        indent=1) + "\n", encoding="utf-8")
        print(f"wrote {stem}.txt and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
