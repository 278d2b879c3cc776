"""The keys that find a pass or layer of a history, and each pass's keys and position back."""
from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass

from torchlog.errors import closest_matches
from torchlog.labels import split_pass
from torchlog.records import LayerRecord, ModuleRecord, PassRecord

__all__ = ["KEY_FORMS", "KeyIndex", "RunEnd", "claim", "index_of", "left_out_keys"]

KEY_FORMS = (
    "a layer label ('conv2d_3_7'), a short label ('conv2d_3'), a pass ('linear_1_1:2'), "
    "a module address ('features.6', or 'features.6:2' for its 2nd call), or an int "
    "position in layer_labels (negative counts from the end)"
)


@dataclass(frozen=True, slots=True)
class RunEnd:
    """How a forward pass that did not run to its end ended, for the messages of lookups
    that find nothing because of it."""

    how: str  # "stop_after ended the forward pass after 'relu_1_2'", "the forward pass raised"
    open_calls: frozenset[str] = frozenset()  # module calls ('0:1') that had not returned

    @classmethod
    def of(cls, stopped_at: str | None, is_partial: bool, passes: Sequence[PassRecord]) -> RunEnd | None:
        """The end of a run stopped after the pass `stopped_at` (the module calls that ran it
        and had not returned it are still open), or of a run that raised; None for a run
        that ran to its end. `passes` are every pass of the run."""
        if stopped_at is None:
            return cls("the forward pass raised") if is_partial else None
        last = next((p for p in reversed(passes) if p.label == stopped_at), None)
        open_calls = frozenset(last.containing_modules) - frozenset(last.output_of_modules) if last else frozenset()
        return cls(f"stop_after ended the forward pass after {stopped_at!r}", open_calls)


class KeyIndex:
    """Every string key of one history, each naming the label of a pass or of a layer.

    A key names a pass, or a layer that ran more than once (a layer that ran once is found
    as its pass). The index holds strings only, never records, so a pass can find the index
    of its history (`index_of`) without keeping the history or its tensors alive.

    Example:
        >>> import torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.Sequential(torch.nn.ReLU()), torch.ones(2))
        >>> index = KeyIndex(h.passes, h.layers, h.modules)
        >>> index.resolve("0"), index.lookup_keys("relu_1_1")
        ('relu_1_1', (-2, 1, 'relu_1_1', 'relu_1_1:1', '0', '0:1'))
    """

    def __init__(self, passes: Sequence[PassRecord], layers: Iterable[LayerRecord],
                 modules: Mapping[str, ModuleRecord], end: RunEnd | None = None) -> None:
        self.labels = tuple(p.label for p in passes)  # the history's passes, in order
        self._positions = {label: pos for pos, label in enumerate(self.labels)}
        self._targets: dict[str, str] = {}  # key -> pass label, or label of a multi-pass layer
        self._num_passes: dict[str, int] = {}  # target -> passes of its layer
        self._keys_of: dict[str, list[str]] = {}  # pass label -> the keys listed for it
        # Address (and alias) -> per call, the labels it returned: for messages only.
        self._call_outputs = {address: m.call_outputs for m in modules.values()
                              for address in (m.address, *m.aliases)}
        self._end = end  # how the pass ended when it did not run to its end
        by_label = {p.label: p for p in passes}
        self._add_layers(layers)
        self._add_modules(modules, by_label)

    def _add(self, key: str, target: str, num_passes: int, listed: bool = True) -> None:
        """Let `key` find `target` unless an earlier key form took it; list it with the pass."""
        if key in self._targets:
            return
        self._targets[key] = target
        self._num_passes[target] = num_passes
        if listed and target in self._positions:
            self._keys_of.setdefault(target, []).append(key)

    def _add_layers(self, layers: Iterable[LayerRecord]) -> None:
        # `_add` inlined: this runs for every pass of every logged history.
        targets, num_passes, keys_of, positions = (self._targets, self._num_passes,
                                                   self._keys_of, self._positions)
        for layer in layers:
            passes = layer.passes
            num = len(passes)
            if num == 1:  # the usual layer: its label, 'label:1', short and 'short:1' find its pass
                label = passes[0].label  # the layer's label too
                if label not in positions:
                    continue
                short = label[:label.rfind("_")]
                for key, listed in ((label, True), (label + ":1", True), (short, False), (short + ":1", False)):
                    if key not in targets:
                        targets[key] = label
                        num_passes[label] = 1
                        if listed:
                            keys_of.setdefault(label, []).append(key)
                continue
            shown = [r for r in passes if r.label in positions]
            target = passes[0].label if num == 1 else layer.label
            short = layer.label.rsplit("_", 1)[0]
            for name, listed in ((layer.label, True), (short, False)):
                if (num > 1 or shown) and name not in targets:
                    targets[name] = target
                    num_passes[target] = num
                    if listed and target in positions:
                        keys_of.setdefault(target, []).append(name)
                for record in shown:
                    key = f"{name}:{record.pass_num}"
                    if key not in targets:
                        label = record.label
                        targets[key] = label
                        num_passes[label] = num
                        if listed:
                            keys_of.setdefault(label, []).append(key)

    def _add_modules(self, modules: Mapping[str, ModuleRecord], by_label: dict[str, PassRecord]) -> None:
        """Module addresses (and a shared module's other addresses) find their first output;
        innermost modules claim a key first."""
        add, targets, num_passes, keys_of, positions = (self._add, self._targets, self._num_passes,
                                                        self._keys_of, self._positions)
        for module in reversed(modules.values()):
            if not module.call_outputs:
                continue  # never called: no keys
            if len(module.call_outputs) == 1 and not module.aliases:  # the usual module: `_add` inlined
                call = module.call_outputs[0]
                record = by_label.get(call[0]) if call else None
                if record is not None:
                    label, address = record.label, module.address
                    for key in (address, address + ":1"):
                        if key not in targets:
                            targets[key] = label
                            num_passes[label] = record.num_passes
                            if label in positions:
                                keys_of.setdefault(label, []).append(key)
                continue
            firsts = [by_label.get(call[0]) if call else None for call in module.call_outputs]
            only = firsts[0] if len(firsts) == 1 else None
            for address in (module.address, *module.aliases) if module.aliases else (module.address,):
                if only is not None:
                    add(address, only.label, only.num_passes)
                for k, record in enumerate(firsts, start=1):
                    if record is not None:
                        add(f"{address}:{k}", record.label, record.num_passes)
                if len(firsts) > 1 and all(r is not None for r in firsts):
                    owners = {r.layer_label for r in firsts}
                    layer = targets.get(next(iter(owners))) if len(owners) == 1 else None
                    if layer is not None and layer not in self._positions \
                            and self._num_passes[layer] == len(firsts):
                        add(address, layer, len(firsts), listed=False)

    def resolve(self, key: str) -> str | None:
        """The label of the pass or layer `key` names, or None."""
        return self._targets.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._targets

    def position(self, label: str) -> int:
        """0-based position of the pass `label` in its history.

        Raises:
            KeyError: `label` is not the label of a pass of the history.
        """
        return self._positions[label]

    def lookup_keys(self, label: str) -> tuple[int | str, ...]:
        """Every key that finds the pass `label`: its negative and positive positions, then
        its labels and the module calls that returned it, innermost module first.

        Raises:
            KeyError: `label` is not the label of a pass of the history.
        """
        pos = self._positions[label]
        return (pos - len(self.labels), pos, *self._keys_of.get(label, ()))

    def not_found_message(self, key: str) -> str:
        """Why `key` finds nothing: the pass number out of range, the module with several
        differing outputs, or the accepted key forms and the closest labels."""
        base, pass_num = _safe_split(key)
        tail = key.rpartition(":")[2]
        if ":" in key and tail.isdigit() and base == key:  # ':0' is not a pass number
            base, pass_num = key.rpartition(":")[0], int(tail)
        if pass_num is not None and base in self._targets:
            num = self._num_passes[self._targets[base]]
            if self._end is not None:
                return f"{base!r} has passes 1..{num} before {self._end.how}, so {key!r} is not in this history"
            return f"{base!r} has passes 1..{num}, so {key!r} does not exist"
        if base in self._call_outputs:
            return self._module_message(key, base, pass_num)
        near = closest_matches(key, [k for k in self._targets if ":" not in k])
        hint = f"; closest labels: {', '.join(near)}" if near else ""
        ended = f" ({self._end.how}: later passes are not in this history)" if self._end else ""
        return f"no layer matches {key!r}{ended}. A key is {KEY_FORMS}{hint}"

    def _module_message(self, key: str, address: str, call: int | None) -> str:
        """Why the module key `key` (`address`, call `call` or None) finds no pass."""
        outputs = self._call_outputs[address]
        calls = len(outputs)
        before = f" before {self._end.how}" if self._end else ""
        if calls == 0:
            return f"module {address!r} was {'not' if before else 'never'} called{before}"
        times = f"{calls} time{'s' if calls > 1 else ''}"
        if call is not None and not 1 <= call <= calls:
            if self._end is not None:
                return (f"module {address!r} was called {times}{before}: call {call}, if the model "
                        "makes it, is after the stop")
            valid = f"'{address}:1'" if calls == 1 else f"'{address}:1'..'{address}:{calls}'"
            return f"module {address!r} was called {times}, so {key!r} does not exist; use {valid}"
        if call is None and calls > 1:
            return (f"module {address!r} was called {times} and its calls returned different "
                    f"passes; name one call: '{address}:1'..'{address}:{calls}'")
        call = call or 1
        where = f"history.modules[{address!r}].call_layers[{call - 1}]"
        if not outputs[call - 1]:
            if self._end is not None and f"{address}:{call}" in self._end.open_calls:
                return (f"call {call} of module {address!r} had not returned when {self._end.how}: "
                        f"its output comes after the stop, so this history has none; the passes it "
                        f"ran are in {where}")
            if self._end is not None:
                return (f"call {call} of module {address!r} has no output: it returned no tensor, "
                        f"or had not returned when {self._end.how}; the passes it ran are in {where}")
            return (f"call {call} of module {address!r} returned no tensor, so no pass is its "
                    f"output; the passes it ran are in {where}")
        first = outputs[call - 1][0]
        return (f"call {call} of module {address!r} returned {first!r}, which is not in this "
                f"history (layers_to_save left it out); add {key!r} to layers_to_save to keep it, or log "
                "with keep_unsaved_layers=True to keep every pass (the others without values)")


def _safe_split(key: str) -> tuple[str, int | None]:
    try:
        return split_pass(key)
    except ValueError:
        return key, None


def left_out_keys(passes: Iterable[PassRecord], held: Container[str]) -> dict[str, str]:
    """Label forms of the passes of a run whose label is not in `held` (those a
    `layers_to_save` list left out of a history): 'linear_1_1', 'linear_1_1:2', 'linear_1',
    'linear_1:2' -> the pass label; a layer's keys name its first pass left out."""
    found: dict[str, str] = {}
    for record in passes:
        if record.label in held:
            continue
        layer = record.layer_label
        short = layer.rsplit("_", 1)[0]
        for key in (record.label, layer, f"{layer}:{record.pass_num}", short, f"{short}:{record.pass_num}"):
            found.setdefault(key, record.label)
    return found


def claim(passes: Iterable[PassRecord], index: KeyIndex) -> None:
    """Record that `passes` belong to the history `index` describes (the latest claim wins),
    so that `print(history[label])` can show the pass's position and keys. Each pass holds
    the index (strings only), which never holds a pass: nothing keeps a history alive."""
    for record in passes:
        record._key_index = index


def index_of(record: PassRecord) -> KeyIndex | None:
    """The index of the history `record` was last placed in, or None if it never was."""
    return getattr(record, "_key_index", None)
