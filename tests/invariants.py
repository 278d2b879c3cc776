"""Shared checks on captured histories: structural invariants (like fx's `graph.lint()`) and the
forward-hook oracle for module outputs."""
from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import torch

from torchlog.history import ModelHistory
from torchlog.labels import ParsedLabel, layer_label, parse_label, pass_label
from torchlog.records import LayerRecord, NodeKind, PassRecord


def check_history(history: ModelHistory, postfunc_used: bool = False,
                  complete: bool | None = None) -> None:
    """Check every structural invariant of `history` in time linear in its size.

    Links are only checked between passes present in the history, so histories
    pruned by `layers_to_save` are accepted; layer numbering is checked exactly when
    nothing was pruned and only for order otherwise.

    Args:
        history: the history to check.
        postfunc_used: the history was logged with an `activation_postfunc`, so saved
            values need not match the op's shape and dtype.
        complete: whether every pass of the forward pass is in the history (so layer
            numbers must have no gaps); None tells from the history itself.

    Raises:
        AssertionError: an invariant does not hold; the message names the pass or
            layer and what was expected.
    """
    passes = list(history)
    by_label = _check_labels_unique(passes)
    _check_lookup(history, passes)
    _check_order(passes)
    _check_links(passes, by_label)
    _check_kinds(passes)
    if complete is None:
        complete = _is_complete(history, passes)
    _check_layers(history, by_label, complete)
    _check_modules(history, by_label)
    if not postfunc_used:
        _check_saved(passes)


def _is_complete(history: ModelHistory, passes: list[PassRecord]) -> bool:
    everything = history.info.all_passes  # kept by the API when it prunes
    return everything is not None and len(everything) == len(passes)


def _check_labels_unique(passes: list[PassRecord]) -> dict[str, PassRecord]:
    by_label: dict[str, PassRecord] = {}
    for record in passes:
        assert record.label not in by_label, (
            f"label {record.label!r} is used by two passes (op_index "
            f"{by_label[record.label].op_index} and {record.op_index})")
        by_label[record.label] = record
    return by_label


def _check_lookup(history: ModelHistory, passes: list[PassRecord]) -> None:
    assert len(history) == len(passes), f"len(history)={len(history)} but it iterates {len(passes)} passes"
    for pos, record in enumerate(passes):
        assert history[pos] is record, f"history[{pos}] is {history[pos]!r}, expected {record!r}"
        assert history[record.label] is record, (
            f"history[{record.label!r}] gives {history[record.label]!r}, not the pass itself")
        assert history.position(record.label) == pos, (
            f"history.position({record.label!r}) is {history.position(record.label)}, not {pos}")
        keys = history.lookup_keys(record.label)
        assert keys[:2] == (pos - len(passes), pos), (
            f"{record.label}: lookup keys start {keys[:2]}, expected {(pos - len(passes), pos)}")
        for key in keys[2:]:
            assert history[key] is record, f"lookup key {key!r} of {record.label} finds {history[key]!r}"


def _check_order(passes: list[PassRecord]) -> None:
    previous = -1
    for record in passes:
        assert record.op_index > previous, (
            f"passes are not in execution order: {record.label} has op_index {record.op_index} "
            f"after op_index {previous}")
        previous = record.op_index


def _check_links(passes: list[PassRecord], by_label: dict[str, PassRecord]) -> None:
    """Each parent lists its child and each child its parent; parents run first."""
    from_parents: set[tuple[str, str]] = set()  # (parent, child) as children lists say
    from_children: set[tuple[str, str]] = set()  # (parent, child) as parents lists say
    for record in passes:
        assert len(set(record.children)) == len(record.children), (
            f"{record.label} lists a child twice: {record.children!r}")
        from_parents.update((record.label, c) for c in record.children if c in by_label)
        for edge in record.parents:
            parent = by_label.get(edge.label)
            if parent is None:
                continue
            assert parent.op_index < record.op_index, (
                f"parent {edge.label} (op_index {parent.op_index}) does not run before its "
                f"child {record.label} (op_index {record.op_index})")
            from_children.add((edge.label, record.label))
    one_sided = sorted(from_children - from_parents)[:3]
    assert not one_sided, "".join(
        f"\n{c} lists parent {p}, whose children {by_label[p].children!r} do not list it back"
        for p, c in one_sided)
    one_sided = sorted(from_parents - from_children)[:3]
    assert not one_sided, "".join(
        f"\n{p} lists child {c}, whose parents {by_label[c].parent_labels!r} do not list it back"
        for p, c in one_sided)


def _check_kinds(passes: list[PassRecord]) -> None:
    """Inputs, buffers and sources have no parents; outputs have exactly one and no children."""
    for record in passes:
        assert isinstance(record.kind, NodeKind), f"{record.label} has kind {record.kind!r}"
        kinds = [f for f in ("is_input", "is_output", "is_buffer", "is_source", "is_created")
                 if getattr(record, f)]
        expected = [] if record.kind is NodeKind.OP else [f"is_{record.kind.value}"]
        assert kinds == expected, f"{record.label} of kind {record.kind} has flags {kinds}"
        if record.is_input or record.is_buffer or record.is_source or record.is_created:
            assert not record.parents, f"{record.label} ({kinds[0]}) has parents {record.parents!r}"
        if record.is_output:
            assert len(record.parents) == 1, f"output {record.label} has parents {record.parents!r}"
            assert not record.children, f"output {record.label} has children {record.children!r}"
        if not record.parents and not kinds:
            raise AssertionError(f"{record.label} has no parents but is not flagged as a source")


def _check_layers(history: ModelHistory, by_label: dict[str, PassRecord], complete: bool) -> None:
    layers = history.layers
    type_counts: Counter[str] = Counter()
    previous_total = -1
    seen_in_layers: set[str] = set()
    index = {layer.label: layer for layer in layers}
    for position, layer in enumerate(layers):
        parsed = _check_layer_label(layer)
        type_counts[layer.layer_type] += 1
        if complete:
            assert parsed.total_num == position, (
                f"layer {layer.label} is layer #{position} in order of first appearance, "
                f"but its label numbers it {parsed.total_num}")
            assert parsed.type_num == type_counts[layer.layer_type], (
                f"layer {layer.label} is {layer.layer_type} #{type_counts[layer.layer_type]}, "
                f"but its label numbers it {parsed.type_num}")
        else:
            assert parsed.total_num > previous_total, (
                f"layer {layer.label} is numbered {parsed.total_num} after layer #{previous_total}")
        previous_total = parsed.total_num
        for label in _check_layer_passes(layer, by_label):
            assert label not in seen_in_layers, f"pass {label} belongs to two layers"
            seen_in_layers.add(label)
        _check_spans(layer, index)
    missing = [label for label in by_label if label not in seen_in_layers]
    assert not missing, f"passes {missing[:5]} are in the history but in none of history.layers"
    firsts = [min(p.op_index for p in layer.passes) for layer in layers]
    assert firsts == sorted(firsts), "history.layers is not ordered by each layer's first pass"


def _check_layer_label(layer: LayerRecord) -> ParsedLabel:
    parsed = parse_label(layer.label)
    assert parsed is not None and parsed.total_num is not None and parsed.pass_num is None, (
        f"layer label {layer.label!r} is not of the form '{{type}}_{{type_num}}_{{total_num}}'")
    assert layer.label == layer_label(layer.layer_type, parsed.type_num, parsed.total_num), (
        f"layer label {layer.label!r} does not start with its layer type {layer.layer_type!r}")
    return parsed


def _check_layer_passes(layer: LayerRecord, by_label: dict[str, PassRecord]) -> list[str]:
    """Pass numbers run 1..n in execution order; returns the labels present in the history."""
    n = len(layer.passes)
    assert n >= 1, f"layer {layer.label} has no passes"
    present: list[str] = []
    previous = -1
    for k, record in enumerate(layer.passes, start=1):
        where = f"pass {k} of layer {layer.label} ({record.label})"
        assert record.pass_num == k, f"{where} has pass_num {record.pass_num}"
        assert record.num_passes == n, f"{where} has num_passes {record.num_passes}, layer has {n}"
        assert record.layer_label == layer.label, f"{where} names layer {record.layer_label!r}"
        assert record.layer_type == layer.layer_type, f"{where} has type {record.layer_type!r}"
        assert record.label == pass_label(layer.label, k, n), f"{where} is mislabelled"
        assert record.op_index > previous, f"{where} runs before the pass preceding it"
        previous = record.op_index
        if record.label in by_label:
            assert by_label[record.label] is record, f"{where} is not the object in the history"
            present.append(record.label)
    assert present, f"layer {layer.label} is listed but none of its passes is in the history"
    return present


def _check_spans(layer: LayerRecord, index: dict[str, LayerRecord]) -> None:
    """The rolled edges agree in both directions and with the passes' own links."""
    for parent_label, span in layer.parent_layers.items():
        parent = index.get(parent_label)
        if parent is None:
            continue
        back = parent.child_layers.get(layer.label)
        assert back is not None, f"layer {parent_label} does not list child layer {layer.label}"
        assert sorted(zip(back.parent_passes, back.child_passes)) == \
            sorted(zip(span.parent_passes, span.child_passes)), (
            f"edge {parent_label} -> {layer.label}: child side says {span}, parent side {back}")
        for p, c in zip(span.parent_passes, span.child_passes):
            parent_pass, child_pass = parent.passes[p - 1], layer.passes[c - 1]
            assert parent_pass.label in child_pass.parent_labels, (
                f"span {parent_label} -> {layer.label} links {parent_pass.label} to "
                f"{child_pass.label}, which are not linked")


def _check_modules(history: ModelHistory, by_label: dict[str, PassRecord]) -> None:
    """Module calls and passes agree both ways on which call returned or contains which pass."""
    modules = history.modules
    said_by_passes = {"output_of_modules": Counter(), "containing_modules": Counter()}
    for record in history:
        for field, counts in said_by_passes.items():
            for call in getattr(record, field):
                address, k = _split_call(call, record, field)
                module = modules.get(address)
                assert module is not None, (
                    f"{record.label}.{field} names module {address!r}, which is not in history.modules")
                assert 1 <= k <= module.num_passes, (
                    f"{record.label}.{field} names call {k} of {address!r}, which was called "
                    f"{module.num_passes} times")
                counts[(record.label, call)] += 1
        assert len(set(record.containing_modules)) == len(record.containing_modules), (
            f"{record.label} is inside the same module call twice: {record.containing_modules!r}")
    said_by_modules = {"output_of_modules": Counter(), "containing_modules": Counter()}
    for address, module in modules.items():
        assert module.address == address, f"modules[{address!r}] has address {module.address!r}"
        assert len(module.call_layers) == len(module.call_outputs), (
            f"module {address!r}: {len(module.call_outputs)} calls in call_outputs, "
            f"{len(module.call_layers)} in call_layers")
        for k, (outputs, inside) in enumerate(zip(module.call_outputs, module.call_layers), start=1):
            for field, labels in (("output_of_modules", outputs), ("containing_modules", inside)):
                said_by_modules[field].update((label, f"{address}:{k}") for label in labels
                                              if label in by_label)
        for child in module.children:
            assert child in modules, f"module {address!r} lists unknown submodule {child!r}"
    listing = {"output_of_modules": "call_outputs", "containing_modules": "call_layers"}
    for field, by_passes in said_by_passes.items():
        by_modules = said_by_modules[field]
        for label, call in list((by_passes - by_modules) + (by_modules - by_passes))[:1]:
            address, k = call.rpartition(":")[::2]
            raise AssertionError(
                f"{label}.{field} lists {call!r} {by_passes[(label, call)]} time(s), but "
                f"modules[{address!r}].{listing[field]}[{int(k) - 1}] lists {label} "
                f"{by_modules[(label, call)]} time(s)")


def _split_call(call: str, record: PassRecord, field: str) -> tuple[str, int]:
    address, sep, k = call.rpartition(":")
    assert sep and k.isdigit(), f"{record.label}.{field} entry {call!r} is not 'address:call'"
    return address, int(k)


def _check_saved(passes: list[PassRecord]) -> None:
    """Saved tensors (not lazy ones: reading them back is not cheap) match their metadata."""
    for record in passes:
        saved = record.saved
        if not isinstance(saved, torch.Tensor):
            continue
        assert tuple(saved.shape) == record.tensor_meta.shape, (
            f"{record.label}: saved shape {tuple(saved.shape)} != tensor_meta shape "
            f"{record.tensor_meta.shape}")
        assert saved.dtype == record.tensor_meta.dtype, (
            f"{record.label}: saved dtype {saved.dtype} != tensor_meta dtype {record.tensor_meta.dtype}")


def record_module_outputs(model: torch.nn.Module, args: tuple, kwargs: dict | None = None,
                          seed: int = 0) -> tuple[dict[str, list[list[torch.Tensor | str]]], object]:
    """Run `model` plainly under `seed` with a forward hook on every submodule.

    Each hook flattens its module's output with `torchlog.capture.nesting.find_tensors` (the order
    torchlog uses) and clones every tensor at once, so later in-place ops cannot change
    what was seen. A parameter returned as an output is kept as its address (a str), since
    torchlog logs no pass for it.

    Returns:
        (outputs, model output): address -> one list of tensors per call, in call order.
    """
    from torchlog.capture.nesting import find_tensors

    params = {id(p): a for a, p in model.named_parameters()}
    seen: dict[str, list[list[torch.Tensor | str]]] = {}

    def hook_for(address: str):
        def hook(module, inputs, output):
            tensors = [params.get(id(t)) or t.detach().clone() for t, _ in find_tensors(output)]
            seen.setdefault(address, []).append(tensors)
        return hook

    handles = [m.register_forward_hook(hook_for(a)) for a, m in model.named_modules() if a]
    try:
        _seed_everything(seed)
        output = model(*args, **(kwargs or {}))
    finally:
        for handle in handles:
            handle.remove()
    return seen, output


def _seed_everything(seed: int) -> None:
    import random
    import sys

    torch.manual_seed(seed)
    random.seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed % 2**32)


def check_module_outputs(history: ModelHistory, model: torch.nn.Module,
                         seen: dict[str, list[list[torch.Tensor | str]]]) -> None:
    """Compare every module call's logged outputs with what forward hooks saw on a plain run.

    `seen` comes from `record_module_outputs` on an identical copy of `model` run with the
    history's seed. Outputs that are parameters of the model are not logged passes (torchlog
    cannot own them), so they are dropped from the hook side, and only them; each must
    still be a parameter the logged model has.

    Raises:
        AssertionError: a module was called a different number of times, returned a
            different number of logged tensors, or a logged value differs (torch.equal).
    """
    params = dict(model.named_parameters())
    for address, module in history.modules.items():
        calls = seen.get(address, [])
        assert module.num_passes == len(calls), (
            f"module {address!r}: torchlog counts {module.num_passes} calls, hooks saw {len(calls)}")
        for k, (labels, tensors) in enumerate(zip(module.call_outputs, calls), start=1):
            expected = [t for t in tensors if not isinstance(t, str)]
            returned = [t for t in tensors if isinstance(t, str)]
            assert all(name in params for name in returned), f"{address}:{k} returned unknown {returned}"
            assert len(labels) == len(expected), (
                f"module call {address}:{k} returned {len(expected)} tensors (hooks), torchlog "
                f"lists {len(labels)} outputs: {labels!r}")
            for position, (label, want) in enumerate(zip(labels, expected)):
                got = history[label].tensor_contents
                assert isinstance(got, torch.Tensor), f"{address}:{k} output {label} was not saved"
                assert got.shape == want.shape and got.dtype == want.dtype and torch.equal(got, want), (
                    f"module call {address}:{k}, output #{position} ({label}): logged "
                    f"{tuple(got.shape)} {got.dtype} differs from the hooked value "
                    f"{tuple(want.shape)} {want.dtype} (max abs diff "
                    f"{_max_diff(got, want)})")


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.shape != b.shape:
        return "n/a, shapes differ"
    return f"{(a.double() - b.double()).abs().max().item():.3g}" if a.numel() else "0"


def check_against_plain_run(model: torch.nn.Module, args: tuple, kwargs: dict | None = None,
                            seed: int = 0) -> tuple[ModelHistory, torch.nn.Module, Any]:
    """Log a copy of `model` and compare it with a plain hooked run of another copy.

    Both copies start identical and run under `seed`. Checks `check_history`, every
    module call's outputs (`check_module_outputs`) and that the model outputs the
    history reports equal the plain run's outputs exactly.

    Returns:
        (history, the logged copy of the model, the plain run's output).

    Raises:
        AssertionError: any of the checks fails.
    """
    import torchlog
    from torchlog.capture.nesting import find_tensors

    plain, logged = copy.deepcopy(model), copy.deepcopy(model)
    seen, output = record_module_outputs(plain, args, kwargs, seed)
    history = torchlog.log_forward_pass(logged, list(args), input_kwargs=kwargs, random_seed=seed)
    check_history(history, complete=True)
    check_module_outputs(history, logged, seen)
    expected = [t for t, _ in find_tensors(output)]
    labels = history.output_layers
    assert len(labels) == len(expected), (
        f"the model returned {len(expected)} tensors, the history has outputs {labels!r}")
    for position, (label, want) in enumerate(zip(labels, expected)):
        got = history[label].tensor_contents
        assert got.shape == want.shape and torch.equal(got, want.detach()), (
            f"model output #{position} ({label}) differs from a plain forward with seed {seed} "
            f"(max abs diff {_max_diff(got, want.detach())})")
    return history, logged, output


def ancestors(history: ModelHistory, labels: list[str]) -> set[str]:
    """`labels` and every pass they depend on, following parent links."""
    seen: set[str] = set()
    stack = list(labels)
    while stack:
        label = stack.pop()
        if label not in seen:
            seen.add(label)
            stack.extend(history[label].parent_labels)
    return seen
