"""Netron's metrics attachment: per-node time, bytes and activation statistics as JSON."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchlog.export.activations import activation_stats
from torchlog.export.costs import cost_by_module

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["metrics_path", "node_metrics", "write_metrics", "SIGNATURE"]

SIGNATURE = "netron:attachment"  # how Netron recognises an attachment file


def metrics_path(model_path: str | Path) -> Path:
    """Where the metrics of a model file go: `run.onnx` and `run.onnx.json` -> `run.metrics.json`.

    Example:
        >>> str(metrics_path("out/run.onnx.json"))
        'out/run.metrics.json'
    """
    path = Path(model_path)
    name = path.name
    for suffix in (".json", ".onnx"):
        name = name.removesuffix(suffix)
    return path.with_name(f"{name}.metrics.json")


def node_metrics(history: "ModelHistory") -> list[dict[str, Any]]:
    """One entry per (node, metric): ops by label, module calls by call ('block1:1').

    Ops get `time (µs)`, `output bytes`, with profile=True `saved for backward bytes` (and
    `CUDA peak bytes` on CUDA), and, when saved, `mean`, `std` (population), `min`, `max`
    and the counts of NaN and infinite values (`torchlog.statistics`, as in the viewer);
    module calls the totals of everything inside them (`torchlog.export.cost_by_module`).
    Statistics of a value with no finite entry are left out, since JSON has no NaN.

    Example:
        >>> import torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.ReLU(), torch.tensor([-1.0, 3.0]))
        >>> [(m['name'], m['value']) for m in node_metrics(h) if m['target'] == 'relu_1_1'][1:4]
        [('output bytes', 8), ('mean', 1.5), ('std', 1.5)]
    """
    entries: list[dict[str, Any]] = []
    summaries = activation_stats(history)
    for record in history:
        if not record.is_input:
            _add(entries, record.label, "time (µs)", round(record.elapsed_s * 1e6, 3))
            _add(entries, record.label, "output bytes", record.num_bytes)
            for name, value in (("saved for backward bytes", record.saved_for_backward_bytes),
                                ("CUDA peak bytes", record.peak_bytes)):
                if value is not None:  # profile=True
                    _add(entries, record.label, name, value)
        stats = summaries.get(record.label)
        if stats is not None:
            for name in ("mean", "std", "min", "max", "num_nan", "num_inf"):
                _add(entries, record.label, name, getattr(stats, name))
    for call, cost in cost_by_module(history).items():
        _add(entries, call, "time (µs)", round(cost.elapsed_s * 1e6, 3))
        _add(entries, call, "ops", cost.num_ops)
        for name, value in (("saved for backward bytes", cost.saved_for_backward_bytes),
                            ("CUDA peak bytes", cost.peak_bytes)):
            if value is not None:
                _add(entries, call, name, value)
    return entries


def _add(entries: list[dict[str, Any]], target: str, name: str, value: float | None) -> None:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return
    entries.append({"kind": "node", "target": target, "name": name, "value": value})


def write_metrics(history: "ModelHistory", path: str | Path) -> Path:
    """Write the attachment file Netron opens after a model; returns its path.

    Example:
        >>> import json, tempfile, torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.ReLU(), torch.ones(2))
        >>> path = write_metrics(h, f"{tempfile.mkdtemp()}/relu.metrics.json")
        >>> json.loads(path.read_text())["signature"]
        'netron:attachment'
    """
    path = Path(path)
    document = {"signature": SIGNATURE, "metrics": node_metrics(history)}
    path.write_text(json.dumps(document, indent=1, ensure_ascii=False), encoding="utf-8")
    return path
