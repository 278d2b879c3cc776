"""The module hierarchy printed like `print(model)`, with what each module did beside it."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torchlog.labels import split_pass
from torchlog.records import ModuleRecord

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["module_tree"]

_INDENT = "  "
MAX_SHAPES_SHOWN = 3
MAX_COLUMN = 64  # the facts start at most this far right


@dataclass(slots=True)
class _Totals:
    """What the passes of one module's calls add up to."""

    elapsed_s: float = 0.0
    num_ops: int = 0


def module_tree(history: "ModelHistory") -> str:
    """The model's modules nested as `print(model)` nests them, one line each, with its
    output shape, parameter count, call count and the time spent in the ops it ran.

    A module that ran several times lists its distinct output shapes; one that was never
    called (a `ModuleList` holding blocks) says so, and so does the model of a partial
    history. Time is the sum of the ops' own
    times (`elapsed_s`) inside every call, nested modules included.

    Example:
        >>> import torch, torchlog
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
        >>> h = torchlog.log_forward_pass(net, torch.ones(2, 3))
        >>> print(module_tree(h).replace(' ', '')[:120])  # times vary from run to run
        Sequential(out(2,4)·16params·1call·...
    """
    modules = history.modules
    totals = _module_totals(history)
    shapes = {p.label: tuple(p.shape) for p in history}
    root_facts = _facts([tuple(shapes[label]) for label in history.output_layers],
                        history.num_params, 1, sum(p.elapsed_s for p in history))
    if history.is_partial:
        root_facts += " · raised (partial history)"
    rows = [(f"{history.model_name}(" if modules else history.model_name, root_facts)]
    children = set(c for m in modules.values() for c in m.children)
    for address, module in modules.items():
        if address not in children:
            rows += _subtree(module, modules, totals, shapes, 1)
    if modules:
        rows.append((")", ""))
    width = min(MAX_COLUMN, max(len(left) for left, facts in rows if facts) + 2)
    return "\n".join(f"{left:<{width}}{facts}".rstrip() for left, facts in rows)


def _subtree(module: ModuleRecord, modules: Mapping[str, ModuleRecord],
             totals: dict[str, _Totals], shapes: dict[str, tuple[int, ...]],
             depth: int) -> list[tuple[str, str]]:
    pad = _INDENT * depth
    name = module.address.rpartition(".")[2]
    opener = "(" if module.children else ""
    rows = [(f"{pad}({name}): {module.type_name}{opener}", _module_facts(module, totals, shapes))]
    for child in module.children:
        if child in modules:
            rows += _subtree(modules[child], modules, totals, shapes, depth + 1)
    if module.children:
        rows.append((f"{pad})", ""))
    return rows


def _module_facts(module: ModuleRecord, totals: dict[str, _Totals],
                  shapes: dict[str, tuple[int, ...]]) -> str:
    if module.num_passes == 0:
        return f"{module.num_params:,} params · not called"
    outputs = [shapes[label] for call in module.call_outputs for label in call[:1] if label in shapes]
    total = totals.get(module.address, _Totals())
    return _facts(outputs, module.num_params, module.num_passes, total.elapsed_s)


def _facts(outputs: list[tuple[int, ...]], num_params: int, num_calls: int, elapsed_s: float) -> str:
    distinct = list(dict.fromkeys(outputs))
    shown = ", ".join(str(s) for s in distinct[:MAX_SHAPES_SHOWN])
    if len(distinct) > MAX_SHAPES_SHOWN:
        shown += f", +{len(distinct) - MAX_SHAPES_SHOWN} more"
    out = f"out {shown} · " if distinct else ""
    calls = "1 call" if num_calls == 1 else f"{num_calls} calls"
    return f"{out}{num_params:,} params · {calls} · {_duration(elapsed_s)}"


def _duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def _module_totals(history: "ModelHistory") -> dict[str, _Totals]:
    """Time and op count per module address, over all its calls, nested modules included."""
    totals: dict[str, _Totals] = {}
    for record in history:
        for call in record.containing_modules:
            total = totals.setdefault(split_pass(call)[0], _Totals())
            total.elapsed_s += record.elapsed_s
            total.num_ops += 1
    return totals
