"""Module calls as ONNX functions: each call's ops become the body of a function that the
enclosing graph calls, so Netron opens a module like a subgraph."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchlog.records import ModuleRecord, PassRecord

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["CallScope", "call_tree", "function_name", "OP_DOMAIN", "MODULE_DOMAIN"]

OP_DOMAIN = "torchlog"  # every logged op: op_type is its torch function
MODULE_DOMAIN = "torchlog.module"  # module calls: op_type is the module's class


@dataclass(slots=True, eq=False)
class CallScope:
    """One module call (or the model's top level) and what ran directly inside it."""

    key: str | None  # 'block1.inner:1'; None for the top level
    items: list[PassRecord | CallScope] = field(default_factory=list)  # in execution order
    labels: set[str] = field(default_factory=set)  # every pass inside, nested calls included
    inputs: list[str] = field(default_factory=list)  # values it reads from outside
    outputs: list[str] = field(default_factory=list)  # values it makes that are read outside


def call_tree(history: "ModelHistory") -> CallScope:
    """Nest the passes (inputs excepted, they are graph inputs) by module call.

    Example:
        >>> import torch, torchlog
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        >>> root = call_tree(torchlog.log_forward_pass(net, torch.ones(1, 2)))
        >>> [getattr(item, 'key', None) or item.label for item in root.items]
        ['0:1', '1:1', 'output_1_3']
        >>> root.items[0].inputs, root.items[0].outputs
        (['input_1_0'], ['linear_1_1'])
    """
    root = CallScope(None)
    scopes: dict[str, CallScope] = {}
    for record in history:
        if record.is_input:
            continue
        parent = root
        for call in reversed(record.containing_modules):  # outermost first
            scope = scopes.get(call)
            if scope is None:
                scope = scopes[call] = CallScope(call)
                parent.items.append(scope)
            scope.labels.add(record.label)
            parent = scope
        root.labels.add(record.label)
        parent.items.append(record)
    _find_boundaries(history, scopes.values())
    return root


def _find_boundaries(history: "ModelHistory", scopes: Any) -> None:
    """Inputs: values read inside but made outside; outputs: made inside, read outside."""
    by_label = {record.label: record for record in history}
    readers = {label: [c for c in record.children if c in by_label]
               for label, record in by_label.items()}
    failed = set(history.info.failed_parents)
    for scope in scopes:
        inside = scope.labels
        ordered = sorted(inside, key=lambda label: by_label[label].op_index)
        reads = (edge.label for label in ordered for edge in by_label[label].parents)
        scope.inputs = list(dict.fromkeys(l for l in reads if l in by_label and l not in inside))
        scope.outputs = [label for label in ordered
                         if label in failed or any(c not in inside for c in readers[label])]


def function_name(scope: CallScope, modules: dict[str, ModuleRecord]) -> tuple[str, str]:
    """(name, overload) of a call's function: the module's class, and the call itself.

    Example:
        >>> from torchlog.records import ModuleRecord
        >>> lin = ModuleRecord("fc", "Linear", 8, (), (("linear_1_1",),), (("linear_1_1",),))
        >>> function_name(CallScope("fc:1"), {"fc": lin})
        ('Linear', 'fc:1')
    """
    address = scope.key.rpartition(":")[0]
    module = modules.get(address)
    return (module.type_name if module is not None else "Module"), scope.key
