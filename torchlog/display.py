"""Text views of histories and records, in the formats of the TorchLens article."""
from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch

from torchlog.lookup import index_of
from torchlog.optional import require
from torchlog.records import LayerRecord, PassRecord

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["human_size", "shape_text", "pass_ranges", "format_history", "format_pass",
           "format_layer", "to_dataframe"]

_INDENT = "    "


def human_size(num_bytes: float) -> str:
    """Format a byte count with 1024-based units: `253.5 KB`."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(num_bytes) < 1024 or unit == "GB":
            return f"{num_bytes:.1f} {unit}" if unit != "B" else f"{int(num_bytes)} B"
        num_bytes /= 1024
    return f"{num_bytes:.1f} TB"


def shape_text(shape: Sequence[int]) -> str:
    """`(6, 5)`, `(4,)` or `()`, as Python prints a tuple (numpy or torch sizes too)."""
    return str(tuple(int(size) for size in shape))


def pass_ranges(pass_nums: Iterable[int], sep: str = ", ") -> str:
    """Compress pass numbers into ranges: (1, 2, 3, 5) -> `1-3, 5` (with sep ', ')."""
    runs: list[list[int]] = []
    for num in sorted(set(pass_nums)):
        if runs and num == runs[-1][-1] + 1:
            runs[-1].append(num)
        else:
            runs.append([num])
    return sep.join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _structure(history: "ModelHistory") -> str:
    loops = (f"recurrent (at most {history.max_passes} passes)" if history.is_recurrent
             else "purely feedforward")
    branching = "with branching" if history.has_branching else "without branching"
    return f"{loops}, {branching}; {len(history.modules)} total modules."


def format_history(history: "ModelHistory") -> str:
    """The `print(history)` text: summary lines, module hierarchy, then every pass."""
    info = history.info
    param_passes = history.param_passes
    used = {p.address: p for r in param_passes for p in r.params}.values()
    param_bytes = sum(p.num_bytes for p in used)
    num_params = sum(p.num_params for p in used)
    state = " (partial: the forward pass raised)" if info.is_partial else ""
    lines = [
        f"Log of {info.model_name} forward pass{state}:",
        f"{_INDENT}Model structure: {_structure(history)}",
        f"{_INDENT}{history.num_tensors} tensors ({human_size(history.num_bytes)}) computed in forward "
        f"pass; {history.num_saved} tensors ({human_size(history.num_saved_bytes)}) saved.",
        f"{_INDENT}{len(param_passes)} parameter operations ({num_params} params total; "
        f"{human_size(param_bytes)}).",
        f"{_INDENT}Random seed: {info.random_seed}",
        f"{_INDENT}Time elapsed: {info.elapsed_s:.3f}s",
    ]
    if info.is_partial:
        lines.append(f"{_INDENT}Stopped at: {info.failure}")
    if info.stopped_at is not None:
        lines.append(f"{_INDENT}Stopped after: {info.stopped_at} (stop_after)")
    if info.interventions:
        changed = len({r.label for r in info.interventions})
        lines.append(f"{_INDENT}Interventions: {len(info.interventions)} fired, on {changed} "
                     f"pass{'es' if changed != 1 else ''} (history.interventions)")
    lines.append(f"{_INDENT}Module Hierarchy:")
    lines += _hierarchy_lines(history, 2)
    lines.append(f"{_INDENT}Layers:")
    for pos, record in enumerate(history):
        suffix = f"(pass {record.pass_num} of {record.num_passes})" if record.num_passes > 1 else ""
        lines.append(f"{_INDENT * 2}{pos}: {record.label} {suffix}")
    return "\n".join(lines)


def _hierarchy_lines(history: "ModelHistory", depth: int) -> list[str]:
    modules = history.modules
    top = [a for a in modules if "." not in a]

    def name(address: str) -> str:
        calls = modules[address].num_passes
        return f"{address} (x{calls})" if calls > 1 else address

    def block(addresses: list[str], level: int) -> list[str]:
        out: list[str] = []
        leaves: list[str] = []
        pad = _INDENT * level

        def flush() -> None:
            if leaves:
                text = ", ".join(leaves)
                out.extend(textwrap.wrap(text, 100, initial_indent=pad, subsequent_indent=pad,
                                         break_on_hyphens=False))
                leaves.clear()

        for address in addresses:
            children = list(modules[address].children)
            if children:
                flush()
                out.append(f"{pad}{name(address)}:")
                out += block(children, level + 1)
            else:
                leaves.append(name(address))
        flush()
        return out

    return block(top, depth)


def _preview(t: torch.Tensor) -> str:
    view = t.detach()
    while view.dim() > 2:
        view = view[0]
    if view.dim() == 2:
        view = view[:5, :5]
    elif view.dim() == 1:
        view = view[:5]
    text = str(view.cpu()).replace("\n", "\n" + _INDENT * 2)
    return f"{_INDENT * 2}{text}" + ("..." if view.numel() < t.numel() else "")


def format_pass(record: PassRecord) -> str:
    """The `print(history[label])` text of one pass.

    Its position and lookup keys come from the history it was last placed in; a record
    that never was in one shows its op index and its label instead.
    """
    meta = record.tensor_meta
    index = index_of(record)
    keys = index.lookup_keys(record.label) if index is not None else (record.label,)
    where = f"{keys[1] + 1}/{len(index.labels)}" if index is not None else f"{record.op_index + 1}"
    passes = f" (pass {record.pass_num} of {record.num_passes})" if record.num_passes > 1 else ""
    lines = [f"Layer {record.label}{passes}, operation {where}:"]
    lines.append(f"{_INDENT}Output tensor: shape={shape_text(meta.shape)}, dtype={meta.dtype}, size={human_size(meta.num_bytes)}")
    for mark in record.extra.get("interventions", ()):
        change = mark["max_abs_change"]
        lines.append(f"{_INDENT}Intervened: {mark['action']} at site {mark['site']!r} "
                     f"(max |change| {'nan' if change is None else f'{change:.4g}'})")
    if record.saved is None:
        lines.append(f"{_INDENT * 2}(not saved)")
    elif isinstance(record.tensor_contents, torch.Tensor):
        lines.append(_preview(record.tensor_contents))
    if record.params:
        ordered = sorted(record.params, key=lambda p: (len(p.shape), p.shape))
        shapes = ", ".join(str(tuple(p.shape)) for p in ordered)
        lines.append(f"{_INDENT}Params: Computed from params with shape {shapes}; "
                     f"{record.num_params} params total ({human_size(sum(p.num_bytes for p in record.params))})")
    else:
        lines.append(f"{_INDENT}Params: no params used")
    lines.append(f"{_INDENT}Parent Layers: {', '.join(record.parent_labels) or 'no parents'}")
    lines.append(f"{_INDENT}Child Layers: {', '.join(record.children) or 'no children'}")
    grad = f" (gradfunc={record.grad_fn_name})" if record.grad_fn_name else ""
    lines.append(f"{_INDENT}Function: {record.func_name}{grad}")
    inside = record.containing_modules[0].rpartition(":")[0] if record.containing_modules else "(top level)"
    lines.append(f"{_INDENT}Computed inside module: {inside}")
    lines.append(f"{_INDENT}Time elapsed:  {record.elapsed_s:.3E}s")
    if record.saved_for_backward_bytes is not None:  # logged with profile=True
        peak = "" if record.peak_bytes is None else f"; CUDA peak {human_size(record.peak_bytes)}"
        lines.append(f"{_INDENT}Memory: output {human_size(meta.num_bytes)}, saved for backward "
                     f"{human_size(record.saved_for_backward_bytes)}{peak}")
    # A module called once is named without its call number when that name finds this pass.
    outputs = [m.rpartition(":")[0] if m.rpartition(":")[0] in keys else m
               for m in record.output_of_modules]
    lines.append(f"{_INDENT}Output of modules: {', '.join(outputs) or 'none'}")
    lines.append(f"{_INDENT}Output of bottom-level module: {outputs[0] if outputs else 'none'}")
    flags = [name for name in ("input", "output", "buffer", "source", "inplace", "created")
             if getattr(record, f"is_{name}")]
    if flags:
        lines.append(f"{_INDENT}Flags: {', '.join(flags)}")
    lines.append(f"{_INDENT}Lookup keys: {', '.join(str(k) for k in keys)}")
    return "\n".join(lines)


def format_layer(layer: LayerRecord) -> str:
    """A rolled layer: its passes and which passes its edges connect."""
    lines = [f"Layer {layer.label} ({layer.num_passes} passes), function {layer.first.func_name}:"]
    for record in layer.passes:
        lines.append(f"{_INDENT}pass {record.pass_num}: {record.label} shape={record.tensor_meta.shape}")
    for title, links in (("Parent layers", layer.parent_layers), ("Child layers", layer.child_layers)):
        parts = [f"{name} (passes {pass_ranges(span.parent_passes, ',')} -> "
                 f"{pass_ranges(span.child_passes, ',')})"
                 for name, span in links.items()]
        lines.append(f"{_INDENT}{title}: {', '.join(parts) or 'none'}")
    return "\n".join(lines)


def to_dataframe(history: "ModelHistory"):
    """One row per pass with the record's scalar fields."""
    pd = require("pandas", "to_pandas()")
    rows = []
    for record in history:
        rows.append({
            "label": record.label, "layer_label": record.layer_label, "layer_type": record.layer_type,
            "func_name": record.func_name, "op_index": record.op_index, "pass_num": record.pass_num,
            "num_passes": record.num_passes, "shape": record.tensor_meta.shape,
            "dtype": str(record.tensor_meta.dtype), "num_bytes": record.num_bytes,
            "parents": list(record.parent_labels), "children": list(record.children),
            "module": record.module, "containing_modules": list(record.containing_modules),
            "output_of_modules": list(record.output_of_modules), "num_params": record.num_params,
            "grad_fn": record.grad_fn_name, "elapsed_s": record.elapsed_s,
            "saved_for_backward_bytes": record.saved_for_backward_bytes,
            "peak_bytes": record.peak_bytes,
            "is_input": record.is_input, "is_output": record.is_output, "is_buffer": record.is_buffer,
            "is_inplace": record.is_inplace, "has_saved_tensor": record.has_saved_tensor,
        })
    return pd.DataFrame(rows)
