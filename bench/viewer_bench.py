"""Interactive viewer figures, measured in headless Chromium (not timed tests).

    .venv/bin/python bench/viewer_bench.py            # GPT-2 12 layers and a 20,000-op loop
    .venv/bin/python bench/viewer_bench.py --quick    # GPT-2 2 layers and a 2,000-op loop

For each model: HTML size, time to build the page in Python, and in the browser the time
from the start of navigation until the default view is drawn (`open_ms`, the page's own
`performance.now()`; `open_wall_s` adds selenium's round trips), the time to draw every
module expanded and to expand one module from the default view (layout + drawing).
"""
from __future__ import annotations

import argparse
import os
import platform
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
from torchlog.vis.viewer.page import page_html  # noqa: E402


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


def _cases(quick: bool) -> list[tuple[str, nn.Module, tuple]]:
    layers = 2 if quick else 12
    gpt = gpt2_small(num_layers=layers, hidden=256, num_heads=4)
    tokens = torch.randint(0, gpt.config.vocab_size, (1, 128))
    steps = 500 if quick else 5000
    return [(f"GPT-2, {layers} layers, hidden 256, seq 128", gpt, (tokens,)),
            (f"stepped cell, {steps} steps ({steps * 4} ops)", SteppedCell(steps), (torch.randn(4, 16),))]


def _first_module(driver) -> str:
    return driver.execute_script(
        "const g = document.querySelector('[data-expanded=\"false\"]'); return g && g.dataset.module;")


def measure(name: str, model: nn.Module, inputs: tuple, driver, folder: Path) -> dict:
    history = torchlog.log_forward_pass(model, inputs, random_seed=0)
    started = time.perf_counter()
    page = page_html(history)
    build_s = time.perf_counter() - started
    path = folder / "page.html"
    path.write_text(page, encoding="utf-8")
    started = time.perf_counter()
    open_page(driver, path, timeout_s=600)
    open_wall_s = time.perf_counter() - started
    timings = driver.execute_script("return window.torchlogViewer.timings")
    row = {"model": name, "ops": len(history), "html_mb": len(page.encode()) / 2**20,
           "build_s": build_s, "open_wall_s": open_wall_s,
           "open_ms": driver.execute_script("return window.torchlogViewer.openedMs"),
           "phases_ms": driver.execute_script(
               "const p = window.torchlogViewer.phases; return `script ${p.script.toFixed(0)}, "
               "graphviz ${p.graphviz.toFixed(0)}, drawn ${p.drawn.toFixed(0)}`"),
           "open_draw_ms": timings[-1]["ms"],
           "default_nodes": timings[-1]["nodes"], "mode": driver.execute_script(
               "return window.torchlogViewer.state.mode")}
    module = _first_module(driver)
    if module:
        run_and_wait(driver, f"await window.torchlogViewer.toggleModule({module!r});")
        row["expand_one_ms"] = driver.execute_script("return window.torchlogViewer.timings.at(-1).ms")
    run_and_wait(driver, "await window.torchlogViewer.setDepth(1000);", timeout_s=600)
    last = driver.execute_script("return window.torchlogViewer.timings.at(-1)")
    row["all_nodes"], row["expand_all_ms"] = last["nodes"], last["ms"]
    row["expand_all_drawn"] = last["reason"] != "too large"
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}")
    driver = start_browser()
    print(f"browser: {driver.capabilities.get('browserName')} {driver.capabilities.get('browserVersion')}")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name, model, inputs in _cases(args.quick):
                row = measure(name, model.eval(), inputs, driver, Path(tmp))
                print(" | ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                 for k, v in row.items()))
    finally:
        driver.quit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
