"""The facts every exporter attaches to a pass or a layer: one dict of plain values."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchlog.labels import split_pass
from torchlog.records import PassRecord

__all__ = ["pass_facts", "layer_facts", "module_path"]


def module_path(record: PassRecord) -> tuple[str, ...]:
    """Addresses of the modules a pass ran in, outermost first, without call numbers.

    Example:
        >>> import torch, torchlog
        >>> net = torch.nn.Sequential(torch.nn.Sequential(torch.nn.ReLU()))
        >>> h = torchlog.log_forward_pass(net, torch.ones(2))
        >>> module_path(h['relu_1_1'])
        ('0', '0.0')
    """
    return tuple(split_pass(call)[0] for call in reversed(record.containing_modules))


def pass_facts(record: PassRecord) -> dict[str, Any]:
    """The record's fields as plain values (str, int, float, tuples), keyed by name.

    `modules` lists the module addresses outermost first, so `'block1' in modules`
    selects every op that ran anywhere inside `block1`; `module_calls` does the same
    with call numbers (`'block1:2'`). The activation itself is never included.

    Example:
        >>> import torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.Linear(3, 2), torch.ones(1, 3))
        >>> facts = pass_facts(h['linear_1_1'])
        >>> facts['function'], facts['shape'], facts['dtype'], facts['params']
        ('linear', (1, 2), 'torch.float32', ('weight', 'bias'))
    """
    return {
        "label": record.label,
        "layer_label": record.layer_label,
        "layer_type": record.layer_type,
        "function": record.func_name,
        "kind": str(record.kind),
        "op_index": record.op_index,
        "pass_num": record.pass_num,
        "num_passes": record.num_passes,
        "shape": tuple(record.shape),
        "dtype": str(record.dtype),
        "num_bytes": record.num_bytes,
        "module": record.module,
        "modules": module_path(record),
        "module_calls": tuple(reversed(record.containing_modules)),
        "output_of_modules": tuple(record.output_of_modules),
        "call_site": record.call_site,
        "elapsed_s": record.elapsed_s,
        "saved_for_backward_bytes": record.saved_for_backward_bytes,  # None unless profile=True
        "peak_bytes": record.peak_bytes,  # None unless profile=True on CUDA
        "params": tuple(p.address for p in record.params),
        "num_params": record.num_params,
        "grad_fn": record.grad_fn_name,
        "is_inplace": record.is_inplace,
        "has_saved_tensor": record.has_saved_tensor,
    }


def layer_facts(passes: Sequence[PassRecord]) -> dict[str, Any]:
    """The facts of a layer from its passes: the first pass's, with totals over all of them.

    `elapsed_s`, `num_bytes` and `saved_for_backward_bytes` are summed over the passes
    (`peak_bytes` is the highest), `shapes` lists each pass's
    output shape, and the per-pass fields (`label`, `pass_num`, `op_index`) describe the
    layer instead (`label` is the layer label, `op_index` the first pass's).

    Example:
        >>> import torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.Linear(3, 3), [torch.ones(1, 3)])
        >>> layer_facts(h.layer('linear_1_1').passes)['num_passes']
        1
    """
    first = passes[0]
    facts = pass_facts(first)
    facts.pop("pass_num")
    facts.update(
        label=first.layer_label,
        num_passes=len(passes),
        shapes=tuple(tuple(p.shape) for p in passes),
        num_bytes=sum(p.num_bytes for p in passes),
        elapsed_s=sum(p.elapsed_s for p in passes),
        saved_for_backward_bytes=_total(p.saved_for_backward_bytes for p in passes),
        peak_bytes=max((p.peak_bytes for p in passes if p.peak_bytes is not None), default=None),
        module_calls=tuple(dict.fromkeys(c for p in passes for c in reversed(p.containing_modules))),
        output_of_modules=tuple(dict.fromkeys(c for p in passes for c in p.output_of_modules)),
        has_saved_tensor=any(p.has_saved_tensor for p in passes),
    )
    return facts


def _total(values: Any) -> int | None:
    """Sum of the values that are not None; None when all are (not profiled)."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None
