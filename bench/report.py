"""The printed and JSON reports of bench/run.py: tables, and every figure beside its issue 16 target."""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

from run import TARGETS, CallCosts, CaseResult


def _mb(num_bytes: float | None) -> str:
    return "-" if num_bytes is None else f"{num_bytes / 2**20:.1f}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def _table(title: str, header: list[str], rows: list[list[str]]) -> str:
    rows = [header] + rows
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [title]
    for k, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("  ".join(cells))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


HEADER = ["model", "ops", "calls", "plain ms", "log ms", "ratio", "us/op", "saved MB", "+peak MB",
          "held MB", "held max MB"]


def format_ours(results: list[CaseResult]) -> str:
    """torchlog's table: one row per model ('calls' counts module forward calls)."""
    rows = [[r.name, str(r.num_ops), str(r.num_module_calls), _ms(r.plain_s), _ms(r.log_s), f"{r.ratio:.2f}",
             f"{r.us_per_op:.1f}", _mb(r.saved_bytes), _mb(r.extra_peak_bytes), _mb(r.held_bytes),
             _mb(r.held_limit_bytes)] for r in results]
    return _table("torchlog (log_forward_pass, all layers saved, no rendering)", HEADER, rows)


def format_theirs(ours: list[CaseResult], theirs: list[CaseResult]) -> str:
    """TorchLens's table, with its log time over ours measured in the same run of bench/run.py."""
    by_name = {r.name: r for r in ours}
    rows = []
    for t in theirs:
        r = by_name.get(t.name)
        rows.append([t.name, str(t.num_ops), _ms(t.plain_s), _ms(t.log_s), f"{t.ratio:.2f}", f"{t.us_per_op:.1f}",
                     _mb(t.saved_bytes), "-" if r is None else f"{t.log_s / r.log_s:.1f}"])
    header = ["model", "ops", "plain ms", "log ms", "ratio", "us/op", "saved MB", "x ours"]
    return _table("TorchLens (torchlens.trace, all layers saved, no rendering)", header, rows)


def _check(model: str, what: str, value: float, limit: float, at_least: bool = False) -> dict[str, Any]:
    ok = value >= limit if at_least else value <= limit
    return {"model": model, "what": what, "value": value, "limit": limit,
            "sense": ">=" if at_least else "<=", "ok": ok}


def target_checks(ours: list[CaseResult], calls: CallCosts,
                  theirs: list[CaseResult] | str) -> list[dict[str, Any]]:
    """Every figure that issue 16 (or an earlier issue) sets a target for, with the verdict."""
    checks = [_check("Linear(8, 8) on (2, 8)", "us per call", calls.linear_us, TARGETS["us_per_call"]),
              _check("SimpleRecurrent (12 ops)", "us per call", calls.seed_us, TARGETS["us_per_call"]),
              _check("100 AddOne module calls", "us per module call", calls.us_per_module_call,
                     TARGETS["us_per_module_call"])]
    for r in ours:
        if r.is_op_bound:
            checks.append(_check(r.name, "us/op", r.us_per_op, TARGETS["us_per_op"]))
        if r.name in TARGETS["ratio"]:
            checks.append(_check(r.name, "ratio", r.ratio, TARGETS["ratio"][r.name]))
        if r.held_bytes is not None:
            checks.append(_check(r.name, "held MB", r.held_bytes / 2**20, r.held_limit_bytes / 2**20))
        if r.extra_peak_bytes is not None:
            limit = TARGETS["peak_saved_factor"] * r.saved_bytes + TARGETS["held_bytes_per_op"] * r.num_ops
            checks.append(_check(r.name, "+peak MB", r.extra_peak_bytes / 2**20, limit / 2**20))
    if not isinstance(theirs, str):
        by_name = {r.name: r for r in ours}
        for t in theirs:
            r = by_name.get(t.name)
            if r is not None:
                key = "torchlens_factor_op_bound" if r.is_op_bound else "torchlens_factor"
                checks.append(_check(r.name, "TorchLens x ours", t.log_s / r.log_s, TARGETS[key], at_least=True))
    return checks


def format_checks(checks: list[dict[str, Any]]) -> str:
    lines = ["Targets (issue 16; GPT-2 ratio and +peak from earlier issues):"]
    for c in checks:
        verdict = "ok" if c["ok"] else ("OVER" if c["sense"] == "<=" else "UNDER")
        lines.append(f"  {verdict:5} {c['model']}: {c['what']} {c['value']:.2f} (target {c['sense']} {c['limit']:.2f})")
    lines.append(f"  save_to over in-memory log time on ResNet-50: see bench/storage_bench.py "
                 f"(target <= {TARGETS['save_to_ratio']})")
    return "\n".join(lines)


def format_calls(calls: CallCosts) -> str:
    return "\n".join([
        "Fixed cost per call (log time minus plain time):",
        f"  Linear(8, 8) on (2, 8): {calls.linear_us:.0f} us per call "
        f"(log {calls.linear_log_us:.0f} us, plain {calls.linear_plain_us:.0f} us)",
        f"  SimpleRecurrent (12 ops): {calls.seed_us:.0f} us per call "
        f"(log {calls.seed_log_us:.0f} us, plain {calls.seed_plain_us:.0f} us)",
        f"Per module call (100 one-op module calls over the same 100 ops inline): "
        f"{calls.us_per_module_call:.1f} us",
        f"Per submodule never called (one op beside 200 idle AddOne modules, over none): "
        f"{calls.us_per_uncalled_module:.1f} us",
    ])


def format_report(setting: dict[str, Any], ours: list[CaseResult], calls: CallCosts,
                  theirs: list[CaseResult] | str) -> str:
    """The whole printed report, headed by where the figures come from."""
    parts = [f"# {setting['date']}; torchlog {setting['commit']} ({setting['torchlog']}); {setting['uptime']}; "
             f"command: {setting['command']}",
             f"torch {setting['torch']}, {setting['threads']} threads, {setting['clock']} clock, "
             f"{setting['run']} run; load average {setting['load']:.1f} on {setting['cpus']} CPUs"]
    if setting["load"] > setting["cpus"] / 2 and (setting["clock"] == "wall" or setting["threads"] > 1):
        # Intra-op threads wait for each other; when other jobs hold the CPUs, each small
        # op can wait a whole scheduler slice, and plain forward times balloon.
        parts.append("warning: the machine is busy, so wall-clock figures with several threads are "
                     "unreliable; --threads 1 --clock cpu gives steadier ones")
    parts.append(format_ours(ours))
    parts.append("op-bound (issue 16): " + ", ".join(r.name for r in ours if r.is_op_bound))
    parts.append(format_calls(calls))
    parts.append(f"TorchLens: {theirs}" if isinstance(theirs, str) else format_theirs(ours, theirs))
    parts.append(format_checks(target_checks(ours, calls, theirs)))
    return "\n".join(parts)


def _row_json(r: CaseResult) -> dict[str, Any]:
    return {**asdict(r), "ratio": r.ratio, "us_per_op": r.us_per_op, "held_limit_bytes": r.held_limit_bytes}


def report_json(setting: dict[str, Any], ours: list[CaseResult], calls: CallCosts,
                theirs: list[CaseResult] | str) -> dict[str, Any]:
    """Every figure of the report as plain JSON values, for comparing two runs."""
    return {
        "setting": setting,
        "targets": TARGETS,
        "torchlog": [_row_json(r) for r in ours],
        "per_call": {**asdict(calls), "linear_us": calls.linear_us, "seed_us": calls.seed_us},
        "torchlens": theirs if isinstance(theirs, str) else [_row_json(t) for t in theirs],
        "checks": target_checks(ours, calls, theirs),
    }
