"""Time rendering (torchlog.vis) of a 12-layer GPT-2 and of a ~2,000-op chain.

Run: .venv/bin/python bench/render_bench.py [--format svg|pdf|png]

For each view it prints the nodes drawn, the seconds spent building the DOT text and the
seconds for the whole `render_graph` call (DOT text + `dot` layout + writing the file),
the median of a few runs. The target: the rolled and depth-limited views of the GPT-2
render in under 10 s each on the 2-core CI machine; the unrolled views are reported
without a target (they must finish, and the ~2,000-op chain shows what `nslimit` buys).
Logging time is not part of these figures (see bench/run.py for that).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from time import perf_counter

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from models import gpt2_small  # noqa: E402  (bench/ is not a package)

from tests.models import LongChain  # noqa: E402  (the chain the rendering tests use)

import torchlog  # noqa: E402
from torchlog.vis import RenderOptions  # noqa: E402
from torchlog.vis.build import build_graph  # noqa: E402

TARGET_S = 10.0
REPEATS = 3
GPT2_VIEWS = {  # view name -> (render keywords, has the 10 s target)
    "rolled": ({"mode": "rolled"}, True),
    "depth 1": ({"nesting_depth": 1}, True),
    "depth 2": ({"nesting_depth": 2}, True),
    "rolled, depth 3": ({"mode": "rolled", "nesting_depth": 3}, True),
    "unrolled": ({}, False),
}


def _median_s(action, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        started = perf_counter()
        action()
        times.append(perf_counter() - started)
    return statistics.median(times)


def time_view(history: torchlog.ModelHistory, keywords: dict, outdir: Path, fileformat: str,
              repeats: int = REPEATS) -> tuple[int, float, float]:
    """Nodes drawn, median DOT-text seconds and median render seconds of one view."""
    num_nodes = len(build_graph(history, RenderOptions(**keywords)).nodes)
    text_s = _median_s(lambda: history.to_dot(**keywords), repeats)
    render_s = _median_s(lambda: history.render_graph(outpath=outdir / "graph", fileformat=fileformat,
                                                      **keywords), repeats)
    return num_nodes, text_s, render_s


def _row(name: str, num_nodes: int, text_s: float, render_s: float, has_target: bool) -> str:
    verdict = ("ok" if render_s < TARGET_S else "TOO SLOW") if has_target else "-"
    return f"{name:<28}{num_nodes:>7}{text_s:>10.3f}{render_s:>10.2f}   {verdict}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", default="svg", choices=("svg", "pdf", "png"))
    args = parser.parse_args()
    gpt2 = gpt2_small(num_layers=12, hidden=64, num_heads=4)
    tokens = torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(0))
    gpt2_history = torchlog.log_forward_pass(gpt2, tokens, input_kwargs={"use_cache": False},
                                             layers_to_save=None, random_seed=0)
    chain_history = torchlog.log_forward_pass(LongChain(), torch.rand(1, 2), layers_to_save=None,
                                              random_seed=0)
    print(f"GPT-2 12 layers: {len(gpt2_history)} ops; chain: {len(chain_history)} ops; "
          f"format {args.format}, median of {REPEATS} runs")
    print(f"{'view':<28}{'nodes':>7}{'dot text':>10}{'render':>10}   target <{TARGET_S:.0f} s")
    failures = 0
    with tempfile.TemporaryDirectory() as folder:
        for name, (keywords, has_target) in GPT2_VIEWS.items():
            row = time_view(gpt2_history, keywords, Path(folder), args.format)
            failures += has_target and row[2] >= TARGET_S
            print(_row(f"GPT-2 {name}", *row, has_target))
        row = time_view(chain_history, {}, Path(folder), args.format, repeats=1)
        print(_row("chain unrolled", *row, False))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
