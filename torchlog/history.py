"""ModelHistory: the read-only result of one logged forward pass, indexed like TorchLens."""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, overload

from torchlog.errors import InvalidArgumentTypeError, LayerNotFoundError
from torchlog.lookup import KEY_FORMS, KeyIndex, RunEnd, claim, left_out_keys
from torchlog.optional import require
from torchlog.records import FailedOp, LayerRecord, ModuleRecord, PassRecord

__all__ = ["ModelHistory", "RunInfo", "all_passes"]


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
    error: str | None = None  # the exception of a partial history: 'RuntimeError: mat1 and ...'
    # The torch call that raised: its name, call site, source line and tensor arguments' shapes;
    # None when the run ended normally or Python code between ops raised.
    failed_op: FailedOp | None = None
    # Tensors given a gradient hook with save_gradients=True; None when logged without it.
    num_gradient_hooks: int | None = None
    # Every pass of the run, also those layers_to_save left out of the history; None when
    # unknown (a log rebuilt after a crash).
    all_passes: list[PassRecord] | None = field(default=None, repr=False)
    # With intervene: every action applied, in order (torchlog.interventions.InterventionRecord).
    interventions: tuple = ()
    # With stop_after: the label of the pass after which the forward pass was ended.
    stopped_at: str | None = None
    # With activation_postfunc: its name; the saved values are its results, not activations.
    activation_postfunc: str | None = None


class ModelHistory(Sequence):
    """Every op of one forward pass: a sequence of passes in execution order, with keyed lookup.

    As a sequence it holds the passes: `len`, iteration, int positions (negative from the
    end), slices, `reversed`, `index` and `count`. A str key finds a pass or a layer: a
    label, short label, `label:pass` or module address. `keys()`, `values()` and `items()`
    give the pass labels, the passes and (label, pass) pairs in order, as a dict from label
    to pass would; `get(key, default)` looks a key up without raising; `key in history`
    holds for every key `history[key]` accepts and for the history's own passes. `layers`
    gives the rolled view.

    Example:
        >>> import torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.Linear(3, 2), torch.ones(1, 3))
        >>> h.layer_labels
        ['input_1_0', 'linear_1_1', 'output_1_2']
        >>> h['linear_1_1'].tensor_meta.shape, h[-1].label, h.lookup_keys('linear_1_1')[:2]
        ((1, 2), 'output_1_2', (-2, 1))
    """

    def __init__(self, passes: list[PassRecord], layers: list[LayerRecord],
                 modules: dict[str, ModuleRecord], info: RunInfo) -> None:
        self._passes = list(passes)
        self._by_label = {p.label: p for p in self._passes}
        by_label = self._by_label
        self._layers = [l for l in layers
                        if l.passes[0].label in by_label or any(p.label in by_label for p in l.passes)]
        self._layers_by_label = {l.label: l for l in self._layers}
        self._modules = modules
        self._modules_view = MappingProxyType(modules)
        self.info = info
        end = RunEnd.of(info.stopped_at, info.is_partial, info.all_passes or self._passes)
        self._index = KeyIndex(self._passes, self._layers, modules, end)
        claim(self._passes, self._index)  # lets print(record) show its position and keys
        self._left_out: dict[str, str] | None = None  # key -> label of a pass left out; built on a miss

    # ----- lookup ---------------------------------------------------------------------
    @overload
    def __getitem__(self, key: int) -> PassRecord: ...
    @overload
    def __getitem__(self, key: slice) -> list[PassRecord]: ...
    @overload
    def __getitem__(self, key: str) -> PassRecord | LayerRecord: ...

    def __getitem__(self, key: int | slice | str) -> PassRecord | LayerRecord | list[PassRecord]:
        """Return the pass at a position, the passes of a slice, or the pass or layer a str
        key names.

        Raises:
            LayerNotFoundError: no pass, layer or module matches, or the position is out
                of range; the message lists the accepted key forms and the closest labels.
            InvalidArgumentTypeError: `key` is not an int, slice or str.
        """
        if isinstance(key, str):
            found = self._index.resolve(key)
            if found is None:
                raise LayerNotFoundError(self._not_found_message(key))
            return self._by_label.get(found) or self._layers_by_label[found]
        if isinstance(key, int) and not isinstance(key, bool):
            n = len(self._passes)
            if not -n <= key < n:
                raise LayerNotFoundError(
                    f"position {key!r} is out of range for a history of {n} layers "
                    f"(valid: {-n}..{n - 1})")
            return self._passes[key]
        if isinstance(key, slice):
            return self._passes[key]
        raise InvalidArgumentTypeError(
            f"history keys must be str or int (or a slice of positions), got {key!r} of type "
            f"{type(key).__name__}; use {KEY_FORMS}")

    def _not_found_message(self, key: str) -> str:
        """Why `key` finds nothing: a pass of the run that layers_to_save left out, or what
        the key index says."""
        if self._left_out is None:
            everything = self.info.all_passes
            self._left_out = left_out_keys(everything, self._by_label) if everything is not None else {}
        label = self._left_out.get(key)
        if label is None:
            return self._index.not_found_message(key)
        return (f"{key!r} names pass {label!r} of this run, which layers_to_save left out of this "
                "history: it holds only the chosen passes (history.layer_labels); add "
                f"{label!r} to layers_to_save to keep it, or log with keep_unsaved_layers=True to "
                "keep every pass (the others without values)")

    def get(self, key: int | str, default: Any = None) -> PassRecord | LayerRecord | Any:
        """`history[key]`, or `default` when no pass or layer matches.

        Raises:
            InvalidArgumentTypeError: `key` is not an int or str.
        """
        try:
            return self[key]
        except LayerNotFoundError:
            return default

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            return key in self._index
        if isinstance(key, int) and not isinstance(key, bool):
            return -len(self._passes) <= key < len(self._passes)
        return isinstance(key, PassRecord) and self._by_label.get(key.label) is key

    def __iter__(self) -> Iterator[PassRecord]:
        """Iterate the passes in execution order."""
        return iter(self._passes)

    def __len__(self) -> int:
        return len(self._passes)

    def keys(self) -> list[str]:
        """The pass labels in execution order (not every alias a key may use)."""
        return self.layer_labels

    def values(self) -> list[PassRecord]:
        """The passes in execution order, as iteration gives them."""
        return self.passes

    def items(self) -> list[tuple[str, PassRecord]]:
        """(label, pass) pairs in execution order."""
        return [(p.label, p) for p in self._passes]

    def position(self, label: str) -> int:
        """0-based position of the pass `label` in this history (`history[position]`).

        Raises:
            LayerNotFoundError: no pass of this history has that label.
        """
        return self._index.position(self._pass_label(label))

    def lookup_keys(self, label: str) -> tuple[int | str, ...]:
        """Every key that finds the pass `label`: its negative and positive positions, its
        labels, then the module calls that returned it, innermost module first.

        Raises:
            LayerNotFoundError: no pass of this history has that label.
        """
        return self._index.lookup_keys(self._pass_label(label))

    def _pass_label(self, label: str) -> str:
        if label not in self._by_label:
            raise LayerNotFoundError(
                f"{label!r} is not the label of a pass of this history; labels are listed in "
                "history.layer_labels")
        return label

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
        """Return the rolled record of a layer, even when it ran once.

        Raises:
            LayerNotFoundError: `label` is not a key of this history (see `__getitem__`).
        """
        found = self[label]
        if isinstance(found, LayerRecord):
            return found
        return self._layers_by_label[found.layer_label]

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
    def interventions(self) -> tuple:
        """Every action `intervene` applied in this run, in order (InterventionRecords:
        site, pass label, action, max absolute change); () without interventions."""
        return self.info.interventions

    @property
    def stopped_at(self) -> str | None:
        """The pass after which `stop_after` ended the forward pass, or None."""
        return self.info.stopped_at

    @property
    def input_layers(self) -> list[str]:
        """Labels of the model's inputs in this history, in order (as `layer_labels`, only
        the passes a `layers_to_save` list chose)."""
        return [p.label for p in self._passes if p.is_input]

    @property
    def output_layers(self) -> list[str]:
        """Labels of the model's outputs in this history, in the order forward returned them
        (as `layer_labels`, only the passes a `layers_to_save` list chose: add 'output' to
        it to keep them)."""
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

    def to_html(self, path: str, mode: str | None = None, depth: int | None = None,
                focus: str | None = None, colour_by: Mapping[str, float] | None = None,
                colour_legend: str | None = None, *, annotations: Any = None) -> str:
        """Write the interactive viewer (zoom, expand modules, inspect values) to one HTML file.

        The page is self-contained and loads nothing from the network; `mode`
        ('unrolled' or 'rolled') and `depth` set the view it opens with (None: readable
        defaults); `focus` (a label or module address) opens it centred on that node;
        `colour_by` (label -> number) colours op nodes on a scale named by `colour_legend`;
        `annotations` (a `torchlog.vis.viewer.Annotations`) marks nodes and adds panel tables.
        Returns the path written; see `torchlog.vis.viewer.to_html`.

        Raises:
            LogFileNotFoundError: the folder of `path` does not exist.
            InvalidOptionError: an unknown mode or a depth below 1.
        """
        from torchlog.vis.viewer import to_html  # lazily: vis sits above the core

        return to_html(self, path, mode, depth, focus, colour_by, colour_legend, annotations=annotations)

    def show(self, mode: str | None = None, depth: int | None = None,
             focus: str | None = None, height: int | None = None,
             colour_by: Mapping[str, float] | None = None, colour_legend: str | None = None, *,
             annotations: Any = None) -> Any:
        """The interactive viewer inline in a notebook (Jupyter, JupyterLab, VS Code).

        Returns a page object that displays itself as a cell's result (an iframe); no
        extension is needed; `height` sets the frame's height in pixels, and `colour_by`,
        `colour_legend` and `annotations` are those of `to_html`. Outside notebooks, use `to_html`.
        """
        from torchlog.vis.viewer import show

        return show(self, mode, depth, focus, height, colour_by, colour_legend, annotations=annotations)

    def to_dot(self, **options: Any) -> str:
        """The DOT source of the graph, available even without the `dot` binary."""
        from torchlog.vis import to_dot

        return to_dot(self, **options)

    def save(self, path: str, **options: Any) -> str:
        """Write this history and its saved activations to an HDF5 file (see torchlog.storage)."""
        storage = require("torchlog.storage", "history.save()")  # lazily: h5py is optional
        return storage.save_history(self, path, **options)

    def to_networkx(self, mode: str = "unrolled", include_values: bool = False) -> Any:
        """A `networkx.MultiDiGraph`: a node per pass ('rolled': per layer) keyed by label,
        an edge per tensor argument; see `torchlog.export.to_networkx`.

        Raises:
            MissingDependencyError: networkx is missing (`pip install torchlog[networkx]`).
            InvalidOptionError: an unknown mode, or values asked of a history saving none.
        """
        from torchlog.export import to_networkx  # lazily: networkx is an optional extra

        return to_networkx(self, mode, include_values)

    def to_tensorboard(self, logdir_or_writer: Any, step: int = 0) -> str:
        """Write the graph, per-op time and memory, and activation histograms for TensorBoard;
        returns the folder. See `torchlog.export.to_tensorboard`.

        Raises:
            MissingDependencyError: tensorboard is missing (`pip install torchlog[tensorboard]`).
            LogFilePermissionError: the folder cannot be written.
        """
        from torchlog.export import to_tensorboard  # lazily: tensorboard is an optional extra

        return to_tensorboard(self, logdir_or_writer, step)

    def to_onnx(self, path: str) -> str:
        """Write the graph as ONNX for Netron ('.onnx', or '.json' for ONNX's JSON form) and a
        metrics file beside it; returns the path. See `torchlog.export.to_onnx`.

        Raises:
            MissingDependencyError: onnx is missing (`pip install torchlog[onnx]`).
            InvalidOptionError, LogFileNotFoundError, LogFilePermissionError: a bad path.
        """
        from torchlog.export import to_onnx  # lazily: onnx is an optional extra

        return to_onnx(self, path)

    def module_tree(self) -> str:
        """The module hierarchy as `print(model)` shows it, with each module's output shape,
        parameter count, call count and time; see `torchlog.export.module_tree`."""
        from torchlog.export import module_tree

        return module_tree(self)

    def cost_by_module(self) -> dict[str, Any]:
        """Per module call ('block1:2'), its ops' summed time, output bytes and, when logged
        with profile=True, bytes saved for backward and CUDA peak; see
        `torchlog.export.cost_by_module`."""
        from torchlog.export import cost_by_module

        return cost_by_module(self)

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


def all_passes(history: ModelHistory) -> list[PassRecord]:
    """Every pass of the run: those layers_to_save left out too, when the history knows them."""
    everything = history.info.all_passes
    return history.passes if everything is None else everything


def _nbytes(saved: Any) -> int:
    if saved is None:
        return 0
    if hasattr(saved, "element_size"):
        return saved.element_size() * saved.numel()
    return getattr(saved, "num_bytes", 0)  # LazyTensor backends expose their size

