"""ModelHistory: the read-only result of one logged forward pass, indexed like TorchLens."""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from torchlog.errors import (
    InvalidArgumentTypeError,
    LayerNotFoundError,
    MissingDependencyError,
    closest_matches,
)
from torchlog.labels import parse_label, split_pass
from torchlog.records import LayerRecord, ModuleRecord, PassRecord

KEY_FORMS = (
    "a layer label ('conv2d_3_7'), a short label ('conv2d_3'), a pass ('linear_1_1:2'), "
    "a module address ('features.6', or 'features.6:2' for its 2nd call), or an int "
    "position in layer_labels (negative counts from the end)"
)


@dataclass(slots=True)
class RunInfo:
    """Facts about the run itself rather than any one layer."""

    model_name: str
    random_seed: int
    elapsed_s: float
    num_modules: int
    is_partial: bool = False
    failure: str | None = None  # where the forward pass stopped, for partial histories
    failed_parents: tuple[str, ...] = ()  # inputs of the op that raised
    extra: dict[str, Any] = field(default_factory=dict)


class ModelHistory(Mapping):
    """Every op of one forward pass, in execution order.

    Index it with a label, short label, `label:pass`, module address or int position;
    iterate it for the passes in order; `layers` gives the rolled view.

    Example:
        >>> import torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.Linear(3, 2), torch.ones(1, 3))
        >>> h.layer_labels
        ['input_1_0', 'linear_1_1', 'output_1_2']
        >>> h['linear_1_1'].tensor_meta.shape
        (1, 2)
    """

    def __init__(self, passes: list[PassRecord], layers: list[LayerRecord],
                 modules: dict[str, ModuleRecord], info: RunInfo) -> None:
        self._passes = list(passes)
        visible = {p.label for p in self._passes}
        self._layers = [l for l in layers if any(p.label in visible for p in l.passes)]
        self._modules = modules
        self._modules_view = MappingProxyType(modules)
        self.info = info
        self._keys = self._build_keys()
        for pos, record in enumerate(self._passes):
            record.num_ops = len(self._passes)
            record.lookup_keys = (pos - len(self._passes), pos) + self._keys_of.get(record.label, ())

    # ----- lookup ---------------------------------------------------------------------
    def _build_keys(self) -> dict[str, PassRecord | LayerRecord]:
        keys: dict[str, Any] = {}
        keys_of: dict[str, list[str]] = {}

        def add(key: str, target: Any, listed: bool = True) -> None:
            if key in keys:
                return
            keys[key] = target
            if listed and isinstance(target, PassRecord):
                keys_of.setdefault(target.label, []).append(key)

        visible = {p.label: p for p in self._passes}
        for layer in self._layers:
            short = layer.label.rsplit("_", 1)[0]
            shown = [r for r in layer.passes if r.label in visible]
            target = layer.passes[0] if len(layer.passes) == 1 else layer
            for name, listed in ((layer.label, True), (short, False)):
                if len(layer.passes) > 1 or shown:
                    add(name, target, listed)
                for record in shown:
                    add(f"{name}:{record.pass_num}", record, listed)
        for address, module in reversed(self._modules.items()):  # innermost module first
            firsts = [visible.get(call[0]) if call else None for call in module.call_outputs]
            if len(firsts) == 1 and firsts[0] is not None:
                add(address, firsts[0])
            for k, record in enumerate(firsts, start=1):
                if record is not None:
                    add(f"{address}:{k}", record)
            if len(firsts) > 1 and all(r is not None for r in firsts):
                owners = {r.layer_label for r in firsts}
                layer = keys.get(next(iter(owners))) if len(owners) == 1 else None
                if isinstance(layer, LayerRecord) and len(layer.passes) == len(firsts):
                    keys.setdefault(address, layer)
        self._keys_of = {label: tuple(ks) for label, ks in keys_of.items()}
        return keys

    def __getitem__(self, key: int | str) -> PassRecord | LayerRecord:
        """Return the pass or layer `key` names.

        Raises:
            LayerNotFoundError: no pass, layer or module matches; the message lists the
                accepted key forms and the closest labels.
        """
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise InvalidArgumentTypeError(
                f"history keys must be str or int, got {key!r} of type {type(key).__name__}; "
                f"use {KEY_FORMS}")
        if isinstance(key, int):
            n = len(self._passes)
            if not -n <= key < n:
                raise LayerNotFoundError(
                    f"position {key!r} is out of range for a history of {n} layers "
                    f"(valid: {-n}..{n - 1})")
            return self._passes[key]
        found = self._keys.get(key)
        if found is not None:
            return found
        raise LayerNotFoundError(self._not_found_message(key))

    def _not_found_message(self, key: str) -> str:
        base, pass_num = _safe_split(key)
        tail = key.rpartition(":")[2]
        if ":" in key and tail.isdigit() and base == key:  # ':0' is not a pass number
            base, pass_num = key.rpartition(":")[0], int(tail)
        if pass_num is not None and base in self._keys:
            target = self._keys[base]
            n = target.num_passes if isinstance(target, (LayerRecord, PassRecord)) else 1
            return f"{base!r} has passes 1..{n}, so {key!r} does not exist"
        if base in self._modules:
            calls = self._modules[base].num_passes
            if calls == 0:
                return f"module {base!r} was never called in this forward pass"
            return (f"module {base!r} was called {calls} times and its outputs are different "
                    f"layers; use '{base}:1'..'{base}:{calls}'")
        near = closest_matches(key, [k for k in self._keys if ":" not in k])
        hint = f"; closest labels: {', '.join(near)}" if near else ""
        return f"no layer matches {key!r}. A key is {KEY_FORMS}{hint}"

    def __contains__(self, key: object) -> bool:
        if isinstance(key, int) and not isinstance(key, bool):
            return -len(self._passes) <= key < len(self._passes)
        return isinstance(key, str) and key in self._keys

    def __iter__(self) -> Iterator[PassRecord]:
        """Iterate the passes in execution order (not the keys: a history is a list of ops)."""
        return iter(self._passes)

    def __len__(self) -> int:
        return len(self._passes)

    def keys(self):  # Mapping.keys would list every alias; give the labels.
        return self.layer_labels

    # ----- views ------------------------------------------------------------------------
    @property
    def layer_labels(self) -> list[str]:
        """Labels of every pass in execution order (the unrolled view)."""
        return [p.label for p in self._passes]

    @property
    def passes(self) -> list[PassRecord]:
        return list(self._passes)

    @property
    def layers(self) -> list[LayerRecord]:
        """One record per layer with all its passes (the rolled view)."""
        return list(self._layers)

    def layer(self, label: str) -> LayerRecord:
        """Return the rolled record of a layer, even when it ran once."""
        found = self[label]
        if isinstance(found, LayerRecord):
            return found
        for layer in self._layers:
            if layer.label == found.layer_label:
                return layer
        raise LayerNotFoundError(f"no layer record for {label!r}")

    @property
    def modules(self) -> Mapping[str, ModuleRecord]:
        """Submodules by address (read-only), each with its calls and outputs."""
        return self._modules_view

    @property
    def model_name(self) -> str:
        return self.info.model_name

    @property
    def random_seed(self) -> int:
        return self.info.random_seed

    @property
    def elapsed_s(self) -> float:
        return self.info.elapsed_s

    @property
    def is_partial(self) -> bool:
        return self.info.is_partial

    @property
    def input_layers(self) -> list[str]:
        return [p.label for p in self._passes if p.is_input]

    @property
    def output_layers(self) -> list[str]:
        return [p.label for p in self._passes if p.is_output]

    @property
    def num_tensors(self) -> int:
        return len(self._passes)

    @property
    def num_bytes(self) -> int:
        return sum(p.num_bytes for p in self._passes)

    @property
    def num_saved(self) -> int:
        return sum(p.saved is not None for p in self._passes)

    @property
    def num_saved_bytes(self) -> int:
        """Bytes of the saved activations, pass by pass (as the summary reports them)."""
        return sum(_nbytes(p.saved) for p in self._passes)

    @property
    def num_stored_bytes(self) -> int:
        """Bytes of memory the saved tensors really use: a tensor shared by passes counts once.

        An op that returns its input unchanged (eval-mode dropout, `.to()` to the same
        device) shares its parent's saved copy, and an output shares its producer's.
        """
        seen: dict[int, int] = {}
        for p in self._passes:
            t = p.saved
            if t is not None and hasattr(t, "element_size"):
                seen[id(t)] = t.element_size() * t.numel()
        return sum(seen.values())

    @property
    def param_passes(self) -> list[PassRecord]:
        return [p for p in self._passes if p.params]

    @property
    def num_params(self) -> int:
        return sum(m.num_params for m in self._modules.values() if "." not in m.address) \
            if self._modules else 0

    @property
    def max_passes(self) -> int:
        return max((l.num_passes for l in self._layers), default=0)

    @property
    def is_recurrent(self) -> bool:
        return any(l.num_passes > 1 for l in self._layers if l.layer_type not in ("input", "output"))

    @property
    def has_branching(self) -> bool:
        return any(len(p.children) > 1 for p in self._passes)

    @property
    def layers_with_grads(self) -> list[str]:
        return [p.label for p in self._passes if p.has_grad]  # reads no gradient from disk

    def log_backward(self, loss: Any) -> None:
        """Call `loss.backward()` and fill `grad_contents` of every pass it reaches.

        Raises:
            InvalidOptionError: the history was logged without save_gradients=True.
            InvalidArgumentTypeError: `loss` is not a tensor that requires grad.

        Example:
            >>> import torch, torchlog
            >>> h = torchlog.log_forward_pass(torch.nn.Linear(3, 2), torch.ones(1, 3),
            ...                               save_gradients=True)
            >>> h.log_backward(h['linear_1_1'].tensor_contents.sum())
            >>> h.layers_with_grads, h['linear_1_1'].grad_contents
            (['linear_1_1', 'output_1_2'], tensor([[1., 1.]]))
        """
        from torchlog.gradients import log_backward  # history sits below gradients' users

        log_backward(self, loss)

    def to_pandas(self):
        """One row per pass; imports pandas only when called.

        Raises:
            MissingDependencyError: pandas is not installed (`pip install torchlog[pandas]`).
        """
        from torchlog.display import to_dataframe

        return to_dataframe(self)

    def render_graph(self, **options: Any) -> Any:
        """Render the graph with graphviz; see `torchlog.vis.render` for the options.

        Raises:
            MissingDependencyError: graphviz (Python package or `dot`) is missing.
        """
        from torchlog.vis import render  # lazily: graphviz is an optional extra

        return render(self, **options)

    def to_dot(self, **options: Any) -> str:
        """The DOT source of the graph, available even without the `dot` binary."""
        from torchlog.vis import to_dot

        return to_dot(self, **options)

    def save(self, path: str, **options: Any) -> str:
        """Write this history and its saved activations to an HDF5 file (see torchlog.storage)."""
        try:
            from torchlog.storage import save_history  # lazily: h5py is an optional extra
        except ImportError as exc:
            raise MissingDependencyError(
                f"history.save() needs h5py ({exc}); install it with `pip install torchlog[storage]`"
            ) from exc
        return save_history(self, path, **options)

    def summary(self) -> str:
        from torchlog.display import format_history

        return format_history(self)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        state = ", partial" if self.is_partial else ""
        return f"<ModelHistory of {self.model_name}: {len(self._passes)} passes, {len(self._layers)} layers{state}>"

    # Histories are looked up, not compared or hashed by content.
    __eq__ = object.__eq__
    __hash__ = object.__hash__


def _nbytes(saved: Any) -> int:
    if saved is None:
        return 0
    if hasattr(saved, "element_size"):
        return saved.element_size() * saved.numel()
    return getattr(saved, "num_bytes", 0)  # LazyTensor backends expose their size


def _safe_split(key: str) -> tuple[str, int | None]:
    try:
        return split_pass(key)
    except ValueError:
        return key, None


def is_label_like(key: str) -> bool:
    """True when `key` has the shape of a label, full or short."""
    return parse_label(split_pass(key)[0] if ":" in key else key) is not None
