"""The structural invariants of a ModelHistory, and `lint`, which checks them like torch.fx's `Graph.lint()`."""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import torch

from torchlog.errors import LintError, TorchlogError
from torchlog.history import ModelHistory
from torchlog.labels import ParsedLabel, layer_label, parse_label, pass_label
from torchlog.records import LayerRecord, NodeKind, PassRecord

__all__ = ["lint"]

_SOURCE_FLAGS = ("is_input", "is_output", "is_buffer", "is_source", "is_created")
_MODULE_FIELDS = {"output_of_modules": "call_outputs", "containing_modules": "call_layers"}


def lint(history: ModelHistory, *, complete: bool | None = None, check_saved: bool = True) -> None:
    """Check every structural invariant of `history`, in time linear in its size.

    The invariants: labels are unique and every lookup form finds its pass; passes are
    in execution order and parents run before their children; every parent lists its
    child back and the reverse; kinds agree with links (sources have no parents, an
    output has one parent and no children), and `input_layers` and `output_layers` list
    exactly the history's passes of those kinds; layers are numbered in order of first
    appearance, their passes run 1..n and the rolled edges agree with the passes'
    links; module calls and passes agree on which call contains or returned which
    pass; saved tensors have the shape and dtype their metadata states.

    Links are only checked between passes present in the history, so histories pruned
    by `layers_to_save` pass; their layer numbers are checked for order only.

    Args:
        history: the history to check (logged, loaded from a file, or rebuilt).
        complete: whether every pass of the forward pass is in the history, so layer
            numbers must have no gaps; None tells from `history.info.all_passes`.
        check_saved: compare saved tensors with their metadata; turn it off for
            histories logged with an `activation_postfunc`, whose values may differ.

    Raises:
        LintError: some invariant does not hold. The message lists each broken one,
            naming the pass, layer or module and what was expected; `problems` holds them.

    Example:
        >>> import torch, torchlog
        >>> history = torchlog.log_forward_pass(torch.nn.Linear(2, 2), torch.rand(1, 2))
        >>> torchlog.lint(history)
        >>> history[2].op_index = 0
        >>> torchlog.lint(history)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        torchlog.errors.LintError: the history breaks 3 invariant(s):
          - passes are not in execution order: output_1_2 has op_index 0 after op_index 1
        ...
    """
    problems = list(_problems(history, complete, check_saved))
    if problems:
        raise LintError(problems)


def _problems(history: ModelHistory, complete: bool | None, check_saved: bool) -> Iterator[str]:
    passes = list(history)
    by_label: dict[str, PassRecord] = {}
    yield from _labels(passes, by_label)
    yield from _lookup(history, passes)
    yield from _order(passes)
    yield from _links(passes, by_label)
    yield from _kinds(passes)
    yield from _lists(history, by_label)
    if complete is None:
        everything = history.info.all_passes  # kept by the API when it prunes
        complete = everything is not None and len(everything) == len(passes)
    yield from _layers(history, by_label, complete)
    yield from _modules(history, by_label)
    if check_saved:
        yield from _saved(passes)


# ----- passes --------------------------------------------------------------------------------------
def _labels(passes: list[PassRecord], by_label: dict[str, PassRecord]) -> Iterator[str]:
    """Fills `by_label` (the first pass of each label wins)."""
    for record in passes:
        first = by_label.setdefault(record.label, record)
        if first is not record:
            yield (f"label {record.label!r} is used by two passes (op_index {first.op_index} "
                   f"and {record.op_index})")


def _lookup(history: ModelHistory, passes: list[PassRecord]) -> Iterator[str]:
    if len(history) != len(passes):
        yield f"len(history)={len(history)} but it iterates {len(passes)} passes"
    for pos, record in enumerate(passes):
        try:
            yield from _lookup_one(history, record, pos, len(passes))
        except (TorchlogError, LookupError) as exc:  # a key of its own that finds nothing
            yield f"looking up {record.label} raised {type(exc).__name__}: {exc}"


def _lookup_one(history: ModelHistory, record: PassRecord, pos: int, num: int) -> Iterator[str]:
    if history[pos] is not record:
        yield f"history[{pos}] is {history[pos]!r}, expected {record!r}"
    if history[record.label] is not record:
        yield f"history[{record.label!r}] gives {history[record.label]!r}, not the pass itself"
    if history.position(record.label) != pos:
        yield f"history.position({record.label!r}) is {history.position(record.label)}, not {pos}"
    keys = history.lookup_keys(record.label)
    if keys[:2] != (pos - num, pos):
        yield f"{record.label}: lookup keys start {keys[:2]}, expected {(pos - num, pos)}"
    for key in keys[2:]:
        if history[key] is not record:
            yield f"lookup key {key!r} of {record.label} finds {history[key]!r}"


def _order(passes: list[PassRecord]) -> Iterator[str]:
    previous = -1
    for record in passes:
        if record.op_index <= previous:
            yield (f"passes are not in execution order: {record.label} has op_index "
                   f"{record.op_index} after op_index {previous}")
        previous = record.op_index


def _links(passes: list[PassRecord], by_label: dict[str, PassRecord]) -> Iterator[str]:
    """Each parent lists its child and each child its parent; parents run first."""
    from_parents: set[tuple[str, str]] = set()  # (parent, child) as children lists say
    from_children: set[tuple[str, str]] = set()  # (parent, child) as parents lists say
    for record in passes:
        if len(set(record.children)) != len(record.children):
            yield f"{record.label} lists a child twice: {record.children!r}"
        from_parents.update((record.label, c) for c in record.children if c in by_label)
        for edge in record.parents:
            parent = by_label.get(edge.label)
            if parent is None:
                continue
            if parent.op_index >= record.op_index:
                yield (f"parent {edge.label} (op_index {parent.op_index}) does not run before its "
                       f"child {record.label} (op_index {record.op_index})")
            from_children.add((edge.label, record.label))
    for p, c in sorted(from_children - from_parents):
        yield f"{c} lists parent {p}, whose children {by_label[p].children!r} do not list it back"
    for p, c in sorted(from_parents - from_children):
        yield f"{p} lists child {c}, whose parents {by_label[c].parent_labels!r} do not list it back"


def _kinds(passes: list[PassRecord]) -> Iterator[str]:
    """Inputs, buffers and sources have no parents; outputs have exactly one and no children."""
    for record in passes:
        if not isinstance(record.kind, NodeKind):
            yield f"{record.label} has kind {record.kind!r}"
            continue
        flags = [f for f in _SOURCE_FLAGS if getattr(record, f)]
        expected = [] if record.kind is NodeKind.OP else [f"is_{record.kind.value}"]
        if flags != expected:
            yield f"{record.label} of kind {record.kind} has flags {flags}"
        if record.kind not in (NodeKind.OP, NodeKind.OUTPUT) and record.parents:
            yield f"{record.label} (is_{record.kind.value}) has parents {record.parents!r}"
        if record.kind is NodeKind.OUTPUT and len(record.parents) != 1:
            yield f"output {record.label} has parents {record.parents!r}"
        if record.kind is NodeKind.OUTPUT and record.children:
            yield f"output {record.label} has children {record.children!r}"
        if not record.parents and record.kind is NodeKind.OP:
            yield f"{record.label} has no parents but is not flagged as a source"


def _lists(history: ModelHistory, by_label: dict[str, PassRecord]) -> Iterator[str]:
    """The history's lists of inputs and outputs name exactly its passes of that kind, in
    order: no label a lookup of the history cannot find (a pruned history lists only what
    it holds)."""
    for name, flag in (("input_layers", "is_input"), ("output_layers", "is_output")):
        listed = getattr(history, name)
        held = [label for label, record in by_label.items() if getattr(record, flag)]
        if listed != held:
            yield f"history.{name} is {listed!r}, but its passes with {flag} are {held!r}"


def _saved(passes: list[PassRecord]) -> Iterator[str]:
    """Saved tensors (not lazy ones: reading them back is not cheap) match their metadata."""
    for record in passes:
        saved = record.saved
        if not isinstance(saved, torch.Tensor):
            continue
        if tuple(saved.shape) != record.tensor_meta.shape:
            yield (f"{record.label}: saved shape {tuple(saved.shape)} != tensor_meta shape "
                   f"{record.tensor_meta.shape}")
        if saved.dtype != record.tensor_meta.dtype:
            yield (f"{record.label}: saved dtype {saved.dtype} != tensor_meta dtype "
                   f"{record.tensor_meta.dtype}")


# ----- layers --------------------------------------------------------------------------------------
def _layers(history: ModelHistory, by_label: dict[str, PassRecord], complete: bool) -> Iterator[str]:
    layers = history.layers
    type_counts: Counter[str] = Counter()
    previous_total = -1
    seen_in_layers: set[str] = set()
    index = {layer.label: layer for layer in layers}
    for position, layer in enumerate(layers):
        type_counts[layer.layer_type] += 1
        parsed = _layer_label(layer)
        if isinstance(parsed, str):
            yield parsed
        else:
            yield from _numbering(layer, parsed, position, type_counts, previous_total, complete)
            previous_total = parsed.total_num
        for label in (yield from _layer_passes(layer, by_label)):
            if label in seen_in_layers:
                yield f"pass {label} belongs to two layers"
            seen_in_layers.add(label)
        yield from _spans(layer, index)
    missing = [label for label in by_label if label not in seen_in_layers]
    if missing:
        yield f"passes {missing[:5]} are in the history but in none of history.layers"
    firsts = [min(p.op_index for p in layer.passes) for layer in layers if layer.passes]
    if firsts != sorted(firsts):
        yield "history.layers is not ordered by each layer's first pass"


def _layer_label(layer: LayerRecord) -> ParsedLabel | str:
    """The parsed layer label, or what is wrong with it."""
    parsed = parse_label(layer.label)
    if parsed is None or parsed.total_num is None or parsed.pass_num is not None:
        return f"layer label {layer.label!r} is not of the form '{{type}}_{{type_num}}_{{total_num}}'"
    if layer.label != layer_label(layer.layer_type, parsed.type_num, parsed.total_num):
        return f"layer label {layer.label!r} does not start with its layer type {layer.layer_type!r}"
    return parsed


def _numbering(layer: LayerRecord, parsed: ParsedLabel, position: int, type_counts: Counter[str],
               previous_total: int, complete: bool) -> Iterator[str]:
    if not complete:
        if parsed.total_num <= previous_total:
            yield f"layer {layer.label} is numbered {parsed.total_num} after layer #{previous_total}"
        return
    if parsed.total_num != position:
        yield (f"layer {layer.label} is layer #{position} in order of first appearance, "
               f"but its label numbers it {parsed.total_num}")
    if parsed.type_num != type_counts[layer.layer_type]:
        yield (f"layer {layer.label} is {layer.layer_type} #{type_counts[layer.layer_type]}, "
               f"but its label numbers it {parsed.type_num}")


def _layer_passes(layer: LayerRecord, by_label: dict[str, PassRecord]) -> Iterator[str]:
    """Pass numbers run 1..n in execution order; returns the labels present in the history."""
    n = len(layer.passes)
    if n == 0:
        yield f"layer {layer.label} has no passes"
        return []
    present: list[str] = []
    previous = -1
    for k, record in enumerate(layer.passes, start=1):
        yield from _layer_pass(layer, record, k, previous)
        previous = record.op_index
        if record.label in by_label:
            if by_label[record.label] is not record:
                yield f"pass {k} of layer {layer.label} ({record.label}) is not the object in the history"
            present.append(record.label)
    if not present:
        yield f"layer {layer.label} is listed but none of its passes is in the history"
    return present


def _layer_pass(layer: LayerRecord, record: PassRecord, k: int, previous: int) -> Iterator[str]:
    n = len(layer.passes)
    where = f"pass {k} of layer {layer.label} ({record.label})"
    if record.pass_num != k:
        yield f"{where} has pass_num {record.pass_num}"
    if record.num_passes != n:
        yield f"{where} has num_passes {record.num_passes}, layer has {n}"
    if record.layer_label != layer.label:
        yield f"{where} names layer {record.layer_label!r}"
    if record.layer_type != layer.layer_type:
        yield f"{where} has type {record.layer_type!r}"
    if record.label != pass_label(layer.label, k, n):
        yield f"{where} is mislabelled"
    if record.op_index <= previous:
        yield f"{where} runs before the pass preceding it"


def _spans(layer: LayerRecord, index: dict[str, LayerRecord]) -> Iterator[str]:
    """The rolled edges agree in both directions and with the passes' own links."""
    for parent_label, span in layer.parent_layers.items():
        parent = index.get(parent_label)
        if parent is None:
            continue
        back = parent.child_layers.get(layer.label)
        if back is None:
            yield f"layer {parent_label} does not list child layer {layer.label}"
        elif sorted(zip(back.parent_passes, back.child_passes)) != \
                sorted(zip(span.parent_passes, span.child_passes)):
            yield f"edge {parent_label} -> {layer.label}: child side says {span}, parent side {back}"
        for p, c in zip(span.parent_passes, span.child_passes):
            if not (1 <= p <= len(parent.passes) and 1 <= c <= len(layer.passes)):
                yield f"span {parent_label} -> {layer.label} links pass {p} to pass {c}, which do not exist"
                continue
            parent_pass, child_pass = parent.passes[p - 1], layer.passes[c - 1]
            if parent_pass.label not in child_pass.parent_labels:
                yield (f"span {parent_label} -> {layer.label} links {parent_pass.label} to "
                       f"{child_pass.label}, which are not linked")


# ----- modules -------------------------------------------------------------------------------------
def _modules(history: ModelHistory, by_label: dict[str, PassRecord]) -> Iterator[str]:
    """Module calls and passes agree both ways on which call returned or contains which pass."""
    by_passes = {field: Counter() for field in _MODULE_FIELDS}
    yield from _calls_named_by_passes(history, by_passes)
    by_modules = {field: Counter() for field in _MODULE_FIELDS}
    yield from _calls_listed_by_modules(history, by_label, by_modules)
    for field, said in by_passes.items():
        listed = by_modules[field]
        for label, call in list((said - listed) + (listed - said)):
            address, k = call.rpartition(":")[::2]
            yield (f"{label}.{field} lists {call!r} {said[(label, call)]} time(s), but "
                   f"modules[{address!r}].{_MODULE_FIELDS[field]}[{int(k) - 1}] lists {label} "
                   f"{listed[(label, call)]} time(s)")


def _calls_named_by_passes(history: ModelHistory, counts: dict[str, Counter]) -> Iterator[str]:
    """Counts (pass, call) pairs as the passes name them, checking each call exists."""
    modules = history.modules
    for record in history:
        for field, said in counts.items():
            for call in getattr(record, field):
                address, sep, k = call.rpartition(":")
                if not sep or not k.isdigit():
                    yield f"{record.label}.{field} entry {call!r} is not 'address:call'"
                    continue
                module = modules.get(address)
                if module is None:
                    yield (f"{record.label}.{field} names module {address!r}, which is not in "
                           "history.modules")
                elif not 1 <= int(k) <= module.num_passes:
                    yield (f"{record.label}.{field} names call {k} of {address!r}, which was called "
                           f"{module.num_passes} times")
                said[(record.label, call)] += 1
        if len(set(record.containing_modules)) != len(record.containing_modules):
            yield f"{record.label} is inside the same module call twice: {record.containing_modules!r}"


def _calls_listed_by_modules(history: ModelHistory, by_label: dict[str, PassRecord],
                             counts: dict[str, Counter]) -> Iterator[str]:
    """Counts (pass, call) pairs as the module records list them, checking their shape."""
    modules = history.modules
    for address, module in modules.items():
        if module.address != address:
            yield f"modules[{address!r}] has address {module.address!r}"
        if len(module.call_layers) != len(module.call_outputs):
            yield (f"module {address!r}: {len(module.call_outputs)} calls in call_outputs, "
                   f"{len(module.call_layers)} in call_layers")
        for k, (outputs, inside) in enumerate(zip(module.call_outputs, module.call_layers), start=1):
            for field, labels in (("output_of_modules", outputs), ("containing_modules", inside)):
                counts[field].update((label, f"{address}:{k}") for label in labels if label in by_label)
        for child in module.children:
            if child not in modules:
                yield f"module {address!r} lists unknown submodule {child!r}"
