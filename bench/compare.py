"""Before/after table from two `bench/run.py --json` files (and optionally two storage_bench ones).

Run: .venv/bin/python bench/compare.py bench/results/log-cost-675bdbd-cpu-unrecorded-2cores-2.json \
         bench/results/log-cost-5bb4f57-cpu-unrecorded-2cores.json \
     [--storage bench/results/save-to-675bdbd-cpu-unrecorded-2cores-2.json \
         bench/results/save-to-5bb4f57-cpu-unrecorded-2cores.json]
Prints a Markdown table per model (plain ms, log ms, ratio, us/op, TorchLens factor,
held MB against its limit, before -> after) and the fixed costs per call, each from the
files' own settings; it warns when the two runs differ in clock or threads, whose figures
do not compare.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _load(path: Path) -> dict[str, Any]:
    """The figures in `path`.

    Raises:
        SystemExit: the file is missing or is not JSON; the message names it.
    """
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"cannot read benchmark figures from {str(path)!r}: {exc}") from exc


def _factors(run: dict[str, Any]) -> dict[str, float]:
    if isinstance(run["torchlens"], str):
        return {}
    ours = {r["name"]: r["log_s"] for r in run["torchlog"]}
    return {t["name"]: t["log_s"] / ours[t["name"]] for t in run["torchlens"] if t["name"] in ours}


def _pair(before: float | None, after: float | None, fmt: str) -> str:
    show = lambda v: "-" if v is None else format(v, fmt)  # noqa: E731
    return f"{show(before)} -> {show(after)}"


def model_table(before: dict[str, Any], after: dict[str, Any]) -> str:
    """A Markdown row per model present in both runs."""
    old = {r["name"]: r for r in before["torchlog"]}
    old_tl, new_tl = _factors(before), _factors(after)
    lines = ["| model | op-bound | plain ms | log ms | ratio | us/op | TorchLens x | held MB (limit) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in after["torchlog"]:
        b = old.get(r["name"])
        if b is None:
            continue
        held = lambda x: None if x["held_bytes"] is None else x["held_bytes"] / 2**20  # noqa: E731
        lines.append(
            f"| {r['name']} | {'yes' if r['is_op_bound'] else ''} "
            f"| {_pair(b['plain_s'] * 1e3, r['plain_s'] * 1e3, '.2f')} "
            f"| {_pair(b['log_s'] * 1e3, r['log_s'] * 1e3, '.2f')} | {_pair(b['ratio'], r['ratio'], '.2f')} "
            f"| {_pair(b['us_per_op'], r['us_per_op'], '.0f')} "
            f"| {_pair(old_tl.get(r['name']), new_tl.get(r['name']), '.1f')} "
            f"| {_pair(held(b), held(r), '.1f')} ({r['held_limit_bytes'] / 2**20:.1f}) |")
    return "\n".join(lines)


def call_lines(before: dict[str, Any], after: dict[str, Any]) -> str:
    b, a = before["per_call"], after["per_call"]
    lines = [
        f"- per call, Linear(8, 8) on (2, 8): {_pair(b['linear_us'], a['linear_us'], '.0f')} us (target <= 200)",
        f"- per call, SimpleRecurrent (12 ops): {_pair(b['seed_us'], a['seed_us'], '.0f')} us (target <= 200)",
        f"- per module call: {_pair(b['us_per_module_call'], a['us_per_module_call'], '.1f')} us (target <= 10)",
    ]
    if "us_per_uncalled_module" in b and "us_per_uncalled_module" in a:  # older runs lack it
        lines.append(f"- per submodule never called: "
                     f"{_pair(b['us_per_uncalled_module'], a['us_per_uncalled_module'], '.1f')} us")
    return "\n".join(lines)


def _setting(run: dict[str, Any]) -> str:
    s = run["setting"]
    return f"torchlog {s['commit']}, {s['date']}, {s['threads']} thread(s), {s['clock']} clock, load {s['load']:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--storage", nargs=2, type=Path, metavar=("BEFORE", "AFTER"),
                        help="two `bench/storage_bench.py --json` files: the save_to ratio")
    args = parser.parse_args(argv)
    before, after = _load(args.before), _load(args.after)
    print(f"before: {_setting(before)}\nafter: {_setting(after)}\n")
    for key in ("clock", "threads"):
        if before["setting"][key] != after["setting"][key]:
            print(f"warning: the runs differ in {key} ({before['setting'][key]!r} vs {after['setting'][key]!r}); "
                  "their times do not compare\n")
    print(model_table(before, after))
    print()
    print(call_lines(before, after))
    if args.storage:
        sb, sa = (_load(p) for p in args.storage)
        print(f"- save_to over in-memory, ResNet-50: {_pair(sb['save_to_ratio'], sa['save_to_ratio'], '.2f')}x "
              f"(target <= {sa['save_to_target']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
