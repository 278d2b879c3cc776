"""The recorder: what capture does per op and at each module boundary of one forward pass."""
from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Iterable, Sequence
from time import perf_counter_ns
from typing import Any

import torch
from torch import nn

from torchlog.capture.boundaries import module_caller
from torchlog.capture.call_sites import call_site, name_of
from torchlog.capture.captured import CapturedPass, Failure, ModuleInfo
from torchlog.capture.failures import failed_args
from torchlog.capture.functionals import run_expanded
from torchlog.capture.nesting import find_tensors
from torchlog.capture.nodes import OP_CONTEXT_KEY, RawNode
from torchlog.capture.options import CaptureOptions
from torchlog.capture.plan import (Act, Firing, FiringRecord, OpView, StopCapture, deliver, first_difference,
                                   inputs_missing, is_written, outputs_missing, out_of_order, run_action, substitute,
                                   unreachable)
from torchlog.errors import InterventionError
from torchlog.labels import layer_type_of
from torchlog.capture.profile import OpProfiler
from torchlog.capture.rng import rng_state
from torchlog.capture.transfer import DeviceCopier
from torchlog.capture.ops import DESCRIPTIONS, PASS_THROUGH, UNDEFINED_VALUES, collapse, describe, output_tensors
from torchlog.capture.writes import DATA_SET, SETITEM
from torchlog.records import ParamInfo, TensorMeta

__all__ = ["FiringRecord", "PASS_THROUGH", "Recorder"]


_Tensor = torch.Tensor
_SETITEM = SETITEM
_AUTOCAST_DEVICES = ("cpu", "cuda")


# _TensorRef.version of a tensor whose `.data` alias was taken: writes through the alias
# bump another version counter, so each read checks the storage's last write instead.
_WATCHED = -2
_DATA_GET = torch._C.TensorBase.__dict__["data"].__get__
# TensorMeta(...) without the NamedTuple's Python-level __new__ (a frame per op).
_new = tuple.__new__
_DESCRIPTIONS = DESCRIPTIONS


class _TensorRef(weakref.ref):
    """Weak reference to a live tensor, naming the node that last wrote it."""

    __slots__ = ("key", "node", "version")


def _act_number(act: Act) -> int:
    return act.number


_LAYER_TYPES: dict[str, str] = {}


def _layer_type(name: str) -> str:
    found = _LAYER_TYPES.get(name)
    if found is None:
        found = _LAYER_TYPES[name] = layer_type_of(name)
    return found


def _written_tensors(args: tuple, kwargs: dict, first: bool, slot: int | None) -> list:
    """The tensors an op announces it writes: its first argument (by name, or `inplace=True`)
    and what it is given as `out=`."""
    if not first and slot is not None:
        flag = args[slot] if slot < len(args) else kwargs.get("inplace", False)
        first = flag is True
    target = args[0] if args else next(iter(kwargs.values()), None)  # `init.uniform_(tensor=w)`
    found = [t for t, _ in find_tensors(target)] if first else []
    out = kwargs.get("out")
    if out is not None:
        found += [t for t, _ in find_tensors(out)]
    return found


def _copy_containers(value: Any) -> Any:
    """`value` with every list, tuple and dict inside it copied; the tensors are not."""
    kind = type(value)
    if kind is list or kind is tuple:
        return kind(_copy_containers(v) for v in value)
    if kind is dict:
        return {k: _copy_containers(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return kind(*(_copy_containers(v) for v in value))
    return value


def _op_context() -> dict | None:
    """The grad mode, inference mode and autocast state now, where not the usual; else None."""
    context: dict[str, Any] = {}
    if not torch.is_grad_enabled():
        context["grad"] = False
    if torch.is_inference_mode_enabled():
        context["inference"] = True
    for device in _AUTOCAST_DEVICES:
        if torch.is_autocast_enabled(device):
            dtype = torch.get_autocast_dtype(device)
            context.setdefault("autocast", {})[device] = str(dtype).removeprefix("torch.")
    return context or None


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # inference tensors carry no version counter
        return -1


def _storage_address(t: torch.Tensor) -> int:
    """Address of the memory `t` lives in (shared by all its views)."""
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, nested, wrapper subclasses
        return id(t)


class Recorder:
    """Collects raw nodes for one forward pass of one model in one thread.

    Fed by the capture mode (`on_op`, once per torch call) and the module boundaries
    (`enter`/`leave`, capture/boundaries.py); plugins add ops of their own with `record_external` and
    `note_failure`. Per op it does the least it can (find parents, time the call, save a
    copy); labels, loop grouping and module summaries wait for assembly. `finish` hands
    over the result as a CapturedPass.
    """

    def __init__(self, model: nn.Module, options: CaptureOptions,
                 named_modules: list | None = None) -> None:
        self.options = options
        self.nodes: list[RawNode] = []
        self.producer: dict[int, _TensorRef] = {}
        self.module_stack: tuple[tuple[str, int], ...] = ()
        self.module_sites: tuple = ()  # where each module on the stack was called from
        # Per module on the stack, the frame that runs its forward (its wrapper's, or torch's
        # hook-calling frame): a call-site search that reaches it has the module's own call
        # site as answer.
        self.module_frames: tuple = ()
        self.root_frame: Any = None  # the frame that calls the model (set by run_captured)
        self.root_site: tuple | None = None  # the user's line that called log_forward_pass
        self.module_calls: dict[str, int] = {}
        self.call_outputs: dict[tuple[str, int], list[int]] = {}  # module call -> returned nodes
        self.last_write: dict[int, int] = {}  # storage address -> last in-place op that wrote it
        # One walk of the model, reused after the pass.
        self.named_modules = named_modules if named_modules is not None else list(model.named_modules())
        self._buffer_storages: set[int] = set()  # memory the model's buffers live in
        self.module_addresses = module_addresses = {}
        # id -> the parameter's address, made a ParamInfo when an op first uses it
        self.param_info: dict[int, str | ParamInfo] = {}
        param_info = self.param_info
        self.buffer_addresses = buffer_addresses = {}
        for address, module in self.named_modules:  # one lean loop: it runs on every call
            if address:
                module_addresses[id(module)] = address
            params, buffers = module._parameters, module._buffers
            if not params and not buffers:
                continue
            prefix = f"{address}." if address else ""
            for name, p in params.items():
                if p is not None and id(p) not in param_info:  # shared: first name wins
                    param_info[id(p)] = prefix + name
            for name, b in buffers.items():
                if b is not None and id(b) not in buffer_addresses:
                    buffer_addresses[id(b)] = prefix + name
                    self._buffer_storages.add(_storage_address(b))
        # (name, stack, parent nodes, call site, tensor arguments) of the first op that raised
        self._failed_op: tuple[str, tuple, tuple[int, ...], tuple | None, tuple] | None = None
        self._error_stack: tuple | None = None  # the deepest module stack an exception left
        # Saved values that are the op's own tensor (not copies), for the copy-before-write
        # rule: storage address -> node indexes, and node index -> version when saved.
        self._by_storage: dict[int, list[int]] = {}
        self._saved_versions: dict[int, int] = {}
        self._save_plain = (options.postfunc is None and options.output_device is None
                            and options.sink is None and not options.copy_all)
        self._lean = not options.save_function_args and not options.profile
        self.mode: Any = None  # the capture mode, pushed again to see inside Python functionals
        self.expanding: set = set()  # Python functionals whose body is running as a scope
        self.scope_calls: dict[str, int] = {}  # functional scope address -> calls so far
        self._call_count = 0
        self._forget = self._make_forget()
        self._rng_before: Any = None  # RNG state before the current op (capture/rng.py)
        self.profiler = OpProfiler(self.named_modules) if options.profile else None
        # Moves saved copies to output_device; from CUDA to the CPU asynchronously.
        self._copier = DeviceCopier(options.output_device) if options.output_device is not None else None
        # Interventions and stops (capture/plan.py): without a plan, one flag test per op
        # and per module exit.
        plan = self._plan = options.plan
        self._acting_ops = plan is not None and bool(plan.at_calls or plan.at_ops)
        self._act_calls = frozenset(call for call, _ in plan.at_calls) if plan is not None else frozenset()
        self._act_nodes = frozenset(plan.at_nodes) if plan is not None else frozenset()
        self._save_tests = plan.save_ops if plan is not None else ()
        self._acting_ops = self._acting_ops or bool(self._act_nodes)
        self._stopping = plan is not None and (plan.stop_node is not None or plan.stop_on is not None)
        self._acting_exits = plan is not None and bool(plan.at_exits or plan.stop_exit or plan.save_exits)
        self.acting_inputs = plan is not None and bool(plan.at_entries)  # read by the forward wrappers
        self.firings: list[FiringRecord] = []  # every action applied, in order
        self.stopped_at: int | None = None  # the node after which the pass was stopped
        self._checked = 0  # nodes found equal to the plan's logged pass so far
        self._stop_missed = False  # a guessed stop node turned out to be another op

    def _make_forget(self) -> Callable[[_TensorRef], None]:
        producer = self.producer

        def forget(ref: _TensorRef) -> None:
            # Runs when a tensor dies, before its id can be reused.
            if producer.get(ref.key) is ref:
                del producer[ref.key]

        return forget

    # ----- nodes -------------------------------------------------------------------
    def _new_node(self, t: torch.Tensor, kind: str, func_name: str, parents: list,
                  params: tuple, output_index: int = 0, call_id: int = -1) -> RawNode:
        nodes = self.nodes
        index = len(nodes)
        node = RawNode(index, kind, func_name, parents, params, self.module_stack,
                       output_index, call_id, _new(TensorMeta, (tuple(t.shape), t.dtype, t.nbytes)))
        nodes.append(node)
        for parent, _ in parents:
            children = nodes[parent].children
            if not children or children[-1] != index:
                children.append(index)
        key = id(t)
        ref = self.producer.get(key)
        if ref is None:
            ref = _TensorRef(t, self._forget)
            ref.key = key
            self.producer[key] = ref
        ref.node = index
        try:
            ref.version = t._version
        except RuntimeError:  # inference tensors carry no version counter
            ref.version = -1
        if self.options.on_node is not None:
            self.options.on_node(node, t)
        return node

    def _maybe_save(self, node: RawNode, t: torch.Tensor, force: bool = False) -> None:
        opts = self.options
        if force or opts.save_all or node.index in opts.save_indices or (
                self._save_tests and node.kind == "op" and self._chosen_by_test(node)):
            # Inputs and buffers are copied: kernels change buffers unannounced (batch norm's
            # running stats), and the model's buffers are put back in place after the pass.
            if node.kind != "op" or id(t) in self.buffer_addresses:
                self._save_copy(node, t)
            else:
                self._save(node, t)

    def _chosen_by_test(self, node: RawNode) -> bool:
        """Whether one of the plan's saving tests (op-stage selectors) accepts `node`."""
        view = OpView(node.func_name, _layer_type(node.func_name), node.module_path,
                      node.meta.shape, node.meta.dtype, node.index, node.output_index)
        return any(test(view) for test in self._save_tests)

    def _save(self, node: RawNode, t: torch.Tensor, version: int | None = None) -> None:
        """Save `t` by reference where nothing needs a copy now (see `before_write`);
        `version` is `t._version` where the caller read it already (-1: none)."""
        opts = self.options
        if self._save_plain:
            if version is None:
                version = _version(t)
            if version == -1:  # an inference tensor: no version counter to check later
                node.saved = t.detach().clone()
                return
            saved = t.detach() if opts.detach and t.requires_grad else t
            key = _storage_address(t)
            # Copied: memory of a buffer (restored in place after the pass), a view saved
            # alone (it would keep its whole base alive; saving every layer, the base is
            # saved too), and what an earlier run of the pass found changed by a write
            # nothing announced.
            if (key in self._buffer_storages or node.index in opts.copy_indices
                    or (not opts.save_all and t._base is not None)):
                saved = saved.clone()
            else:
                self._reference(node.index, t, version, key)
            node.saved = saved
            return
        if opts.sink is not None and opts.postfunc is None and opts.output_device is None:
            # No copy: the sink writes the value before returning, or (a sink with
            # `sink_settle`) writes it later, settled before any write into its memory.
            if opts.copy_all or node.index in opts.copy_indices:  # changed on an earlier run
                node.saved = opts.sink(self.nodes, node.index, t.detach().clone())
                return
            node.saved = opts.sink(self.nodes, node.index, t.detach())
            if opts.sink_settle is not None:
                key = _storage_address(t)
                held = self._by_storage.get(key)
                if held is None:
                    self._by_storage[key] = [node.index]
                else:
                    held.append(node.index)
            return
        self._save_copy(node, t)

    def _reference(self, index: int, t: torch.Tensor, version: int, key: int | None = None) -> None:
        self._saved_versions[index] = version
        if key is None:
            key = _storage_address(t)
        held = self._by_storage.get(key)
        if held is None:
            self._by_storage[key] = [index]
        else:
            held.append(index)

    def _save_copy(self, node: RawNode, t: torch.Tensor) -> None:
        opts = self.options
        saved = self._copy_for_saving(t)
        node.saved = saved if opts.sink is None else opts.sink(self.nodes, node.index, saved)

    def before_write(self, tensors: Iterable[torch.Tensor]) -> None:
        """Copy every saved value that shares memory with `tensors`, which are about to be
        written in place; from then on those saved values are copies."""
        if self._copier is not None and tensors:  # copies still reading them land first
            self._copier.before_write()
        by_storage = self._by_storage
        for t in tensors:
            held = by_storage.pop(_storage_address(t), None)
            if held is None:
                continue
            nodes, versions = self.nodes, self._saved_versions
            for index in held:
                if index not in versions:  # handed to a sink that writes later
                    self.options.sink_settle(index)
                    continue
                node = nodes[index]
                node.saved = node.saved.clone()
                del versions[index]

    def stale_saves(self) -> tuple[int, ...]:
        """Nodes whose saved value (the op's own tensor) changed after it was saved by a
        write nothing announced: their saved values are wrong."""
        nodes, opts = self.nodes, self.options
        stale = [index for index, version in self._saved_versions.items()
                 if _version(nodes[index].saved) != version]
        if opts.sink_settle is not None:
            opts.sink_settle(None)  # every value written
            stale += opts.sink_stale()
        return tuple(sorted(stale))

    def _copy_for_saving(self, t: torch.Tensor) -> Any:
        """A copy of `t` that later in-place ops cannot change, post-processed and moved."""
        opts = self.options
        if opts.postfunc is not None:
            result = opts.postfunc(t)
            if isinstance(result, _Tensor):
                if result is t or result.untyped_storage().data_ptr() == t.untyped_storage().data_ptr():
                    result = result.clone()
                if opts.detach:
                    result = result.detach()
                if opts.output_device is not None:
                    result = result.to(opts.output_device)
            return result
        src = t.detach() if opts.detach else t
        if opts.output_device is not None and t.device != opts.output_device:
            # A buffer is saved just before the op that may update it unannounced (batch norm).
            copy = self._copier.copy(src, write_follows=id(t) in self.buffer_addresses)
            if opts.sink is not None:  # the sink reads it now
                self._copier.wait(-1)
            return copy
        return src.clone()

    def add_source(self, t: torch.Tensor, kind: str, address: str | None = None) -> RawNode:
        """Record a tensor that no logged op produced: an input, buffer or foreign tensor."""
        name = {"input": "input", "buffer": "buffer"}.get(kind, "tensor")
        node = self._new_node(t, kind, name, [], ())
        node.address = address
        self._maybe_save(node, t)
        return node

    def note_copy(self, old: torch.Tensor, new: torch.Tensor) -> None:
        """`new` is a copy of `old` made by no logged op (accelerate moving it to another
        device, capture/offload.py): readers of `new` find `old`'s node as its producer."""
        if id(old) in self.param_info:
            return
        ref = self.producer.get(id(old))
        index = self._current_node(old, ref) if ref is not None else self._source_for(old)
        copy = _TensorRef(new, self._forget)
        copy.key, copy.node, copy.version = id(new), index, _version(new)
        self.producer[id(new)] = copy

    def _source_for(self, t: torch.Tensor) -> int:
        address = self.buffer_addresses.get(id(t))
        kind = "buffer" if address is not None else "source"
        return self.add_source(t, kind, address).index

    # ----- per op (hot path) ---------------------------------------------------------
    def on_op(self, func: Callable, args: tuple, kwargs: dict) -> Any:
        entry = _DESCRIPTIONS.get(func)
        if entry is None:
            entry = describe(func)
        name, not_op, writes_first_arg, body, inplace_slot = entry
        if not_op:
            return func(*args, **kwargs)
        if body is not None and func not in self.expanding:
            return run_expanded(self, func, name, body, args, kwargs)
        # Parents are found before the call: an in-place op (or batch norm updating its
        # running stats) changes its inputs, and the parents are what it read.
        parents, params = self._find_parents(args, kwargs)
        if (writes_first_arg or inplace_slot is not None or "out" in kwargs) and (
                self._by_storage or self._copier is not None):
            self.before_write(_written_tensors(args, kwargs, writes_first_arg, inplace_slot))
        if self._lean:  # the common case, in one go: no argument copies, no profiler
            t0 = perf_counter_ns()
            try:
                out = func(*args, **kwargs)
            except BaseException:
                self._note_failure(name, parents, args, kwargs)
                raise
            elapsed = perf_counter_ns() - t0
            if self._acting_ops:
                out = self._act(func, name, writes_first_arg, args, kwargs, out)
            if type(out) is _Tensor:
                self._record_one(out, name, writes_first_arg or "out" in kwargs, elapsed,
                                 parents, params)
                if name == "data" and func == _DATA_GET:
                    self._watch(args[0])
            else:
                out = self._record_result(func, name, writes_first_arg, args, kwargs, out,
                                          elapsed, parents, params, None)
            if self._stopping:
                self._stop_if_due(func, args, out)
            return out
        if self.options.save_function_args:
            self._rng_before = self._rng_state(args, kwargs)
        token = None if self.profiler is None else self.profiler.start()
        t0 = perf_counter_ns()
        try:
            out = func(*args, **kwargs)
        except BaseException:
            if token is not None:
                self.profiler.stop(token, t0)  # the model may catch it and go on
            self._note_failure(name, parents, args, kwargs)
            raise
        elapsed = perf_counter_ns() - t0 if token is None else self.profiler.stop(token, t0)
        if self._acting_ops:
            out = self._act(func, name, writes_first_arg, args, kwargs, out)
        self._record_result(func, name, writes_first_arg, args, kwargs, out, elapsed,
                            parents, params, None if token is None else self.profiler.last)
        if name == "data" and func == _DATA_GET:
            self._watch(args[0])
        if self._stopping:
            self._stop_if_due(func, args, out)
        return out

    def _watch(self, t: Any) -> None:
        """`t.data` was taken: reads of `t` from now on look for writes through the alias."""
        ref = self.producer.get(id(t)) if isinstance(t, _Tensor) else None
        if ref is not None:
            ref.version = _WATCHED

    def _call_site(self, start: Any = None) -> tuple | None:
        """Where user code made the current op or module call: the search, from frame
        `start` (by default the caller's caller), stops at the frame running the innermost
        module (answer: its call site) or, at the top, at the frame that called the model
        (answer: the line that called log_forward_pass)."""
        if start is None:
            start = sys._getframe(2)
        frames = self.module_frames
        if frames:
            return call_site(frames[-1], self.module_sites[-1], start)
        return call_site(self.root_frame, self.root_site, start)

    def _record_result(self, func: Callable, name: str, writes_first_arg: bool, args: tuple,
                       kwargs: dict, out: Any, elapsed: int, parents: list, params: list,
                       cost: tuple[int, int | None] | None) -> Any:
        """Record the tensors in what an op returned (none: nothing is recorded); return `out`."""
        outs = output_tensors(func, args, out)
        if not outs:
            return out
        self._record(func, name, writes_first_arg or "out" in kwargs, args, kwargs, outs, elapsed,
                     parents, params, cost)
        return out

    def _record_one(self, t: torch.Tensor, name: str, name_inplace: bool, elapsed: int,
                    parents: list, params: list) -> None:
        """`_record` and `_new_node` for the usual op: one plain tensor out, no argument copies."""
        self._call_count += 1
        # Frames: this one, on_op, the mode's __torch_function__, then the code calling the op.
        site = (self._call_site(sys._getframe(3)), self.module_sites)
        nodes, producer = self.nodes, self.producer
        index = len(nodes)
        key = id(t)
        try:
            version = t._version
        except RuntimeError:  # inference tensors carry no version counter
            version = -1
        ref = producer.get(key)
        prior = None
        changed = False
        if ref is None:
            ref = _TensorRef(t, self._forget)
            ref.key = key
            producer[key] = ref
        else:
            prior = nodes[ref.node]
            changed = name_inplace or ref.version not in (version, _WATCHED)
        node = RawNode(index, "op", name, parents, tuple(params) if params else (), self.module_stack,
                       0, self._call_count, _new(TensorMeta, (tuple(t.shape), t.dtype, t.nbytes)))
        nodes.append(node)
        for parent, _ in parents:
            children = nodes[parent].children
            if not children or children[-1] != index:
                children.append(index)
        ref.node = index
        ref.version = version
        node.elapsed_ns = elapsed
        node.site = site
        grad_fn = t.grad_fn
        if grad_fn is not None:
            node.grad_fn_name = type(grad_fn).__name__
        opts = self.options
        if opts.on_node is not None:
            opts.on_node(node, t)
        if opts.save_all or index in opts.save_indices or (self._save_tests and self._chosen_by_test(node)):
            if prior is not None and not changed and prior.saved is not None and opts.save_all:
                node.saved = prior.saved  # an op that returned its input unchanged: store once
                if prior.index in self._saved_versions:  # copied along with it before a write
                    self._reference(index, t, self._saved_versions[prior.index])
            elif key in self.buffer_addresses:
                self._save_copy(node, t)  # a buffer written in place: restored after the pass
            else:
                self._save(node, t, version)
        if changed:
            node.is_inplace = True
            self.last_write[_storage_address(t)] = index

    def record_call(self, func: Callable, name: str, args: tuple, kwargs: dict, out: Any,
                    parents: list, params: list, rng: torch.Tensor | None) -> Any:
        """Record a call that already ran as one op (a functional whose body recorded
        nothing), as `on_op` would have."""
        self._rng_before = rng
        writes = describe(func).writes_first_arg
        if self._acting_ops:
            out = self._act(func, name, writes, args, kwargs, out)
        out = self._record_result(func, name, writes, args, kwargs, out, 0, parents, params, None)
        if self._stopping:
            self._stop_if_due(func, args, out)
        return out

    def rename_call(self, first_node: int, name: str, func_args: tuple, parents: list,
                    params: list, rng: torch.Tensor | None, site: tuple) -> None:
        """Give the one call recorded since `first_node` (a functional's only op) the
        functional's name, arguments, parents and call site, as if it had run as one op."""
        call_id, params_t = self._call_count, tuple(params)
        new = {index for index, _ in parents}
        for node in self.nodes[first_node:]:
            if node.call_id != call_id:
                continue
            for old in {index for index, _ in node.parents} - new:
                self.nodes[old].children.remove(node.index)
            for index in sorted(new - {index for index, _ in node.parents}):
                self.nodes[index].children.append(node.index)
            node.func_name, node.parents, node.params, node.site = name, parents, params_t, site
            if node.func_args is not None:
                node.func_args, node.rng_state = (func_args[0], _copy_containers(func_args[1]),
                                                  _copy_containers(func_args[2])), rng

    def collapse(self, func: Callable) -> None:
        """Run `func` as one op from now on, in this process (its body ran one op)."""
        collapse(func)

    def _find_parents(self, args: tuple, kwargs: dict) -> tuple[list, list]:
        parents: list = []
        params: list = []
        producer = self.producer
        slot = 0
        for value in args:  # `_scan` inlined for the common case: a tensor made by a logged op
            if isinstance(value, _Tensor):
                ref = producer.get(id(value))
                if ref is None:
                    self._scan(value, slot, parents, params)
                else:
                    try:
                        current = ref.version == value._version
                    except RuntimeError:  # an inference tensor: no version counter
                        current = True
                    parents.append((ref.node if current else self._refresh(value, ref), slot))
            elif isinstance(value, (list, tuple, dict)):
                self._scan(value, slot, parents, params)
            slot += 1
        if kwargs:
            for key, value in kwargs.items():
                self._scan(value, key, parents, params)
        return parents, params

    def _scan(self, value: Any, path: Any, parents: list, params: list) -> None:
        if isinstance(value, _Tensor):
            ref = self.producer.get(id(value))
            if ref is not None:
                parents.append((self._current_node(value, ref), path))
                return
            info = self.param_info.get(id(value))
            if info is not None:
                if type(info) is str:  # its first use in this pass
                    info = self.param_info[id(value)] = ParamInfo(
                        info, tuple(value.shape), value.numel(), value.nbytes)
                if info not in params:
                    params.append(info)
                return
            parents.append((self._source_for(value), path))
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                if isinstance(item, (_Tensor, list, tuple, dict)):
                    self._scan(item, (path, i) if not isinstance(path, tuple) else path + (i,),
                               parents, params)
        elif isinstance(value, dict):
            for key, item in value.items():
                self._scan(item, (path, key) if not isinstance(path, tuple) else path + (key,),
                           parents, params)

    def _record(self, func: Callable, name: str, name_inplace: bool, args: tuple, kwargs: dict,
                outs: Any, elapsed: int, parents: list, params: list,
                cost: tuple[int, int | None] | None = None) -> None:
        params_t = tuple(params)
        self._call_count += 1
        call_id = self._call_count
        site = (self._call_site(), self.module_sites)
        call_args = context = None
        if self.options.save_function_args:  # as they are now: the model may grow a list later
            call_args = (func, _copy_containers(args), _copy_containers(kwargs))
            context = _op_context()
        for output_index, (t, _) in enumerate(outs):
            existing = self.producer.get(id(t))
            prior = self.nodes[existing.node] if existing is not None else None
            changed = prior is not None and (name_inplace
                                             or existing.version not in (_version(t), _WATCHED))
            node = self._new_node(t, "op", name, parents, params_t, output_index, call_id)
            node.elapsed_ns = elapsed
            node.is_inplace = changed
            node.site = site
            if cost is not None:  # per call: on its first output; its other outputs get 0
                saved, peak = cost if output_index == 0 else (0, cost[1] and 0)
                node.saved_for_backward_bytes, node.peak_bytes = saved, peak
            grad_fn = t.grad_fn
            if grad_fn is not None:
                node.grad_fn_name = type(grad_fn).__name__
            if prior is not None and not changed and prior.saved is not None and self.options.save_all:
                node.saved = prior.saved  # an op that returned its input unchanged: store once
                if prior.index in self._saved_versions:  # copied along with it before a write
                    self._reference(node.index, t, self._saved_versions[prior.index])
            else:
                self._maybe_save(node, t)
            if call_args is not None:
                node.func_args = call_args
                node.rng_state = self._rng_before
                if context is not None:
                    node.extra = {OP_CONTEXT_KEY: context}
            if changed:
                self.last_write[t.untyped_storage().data_ptr()] = node.index

    def _rng_state(self, args: tuple = (), kwargs: dict | None = None) -> Any:
        """The RNG state now (CPU, and the CUDA device's for an op on CUDA), for replaying
        random ops; one object while it is unchanged (capture/rng.py)."""
        return rng_state(self._rng_before, args, kwargs)

    def _current_node(self, t: torch.Tensor, ref: _TensorRef) -> int:
        """The node holding `t`'s value now (refreshed if it was written through a view)."""
        if ref.version == _version(t):
            return ref.node
        return self._refresh(t, ref)

    def _refresh(self, t: torch.Tensor, ref: _TensorRef) -> int:
        """A node for the current value of `t`, which changed since its producer ran.

        `row = y[:, 0]; row.add_(5)` also changes `y` and every other view of it. The
        last op that wrote into the storage gets one more output holding `t` as it is
        now, with the stale node and the write as parents (extra['view_written_by']
        names the write), so readers depend on the write and see the value they read.
        Writes we could not see (inside one torch call) give a fresh source node.
        """
        writer = self.last_write.get(t.untyped_storage().data_ptr())
        watched = ref.version == _WATCHED
        if writer is None or writer < ref.node:
            if watched:  # nothing wrote through its `.data` alias since its producer ran
                return ref.node
            kind = "buffer" if id(t) in self.buffer_addresses else "source"
            return self.add_source(t, kind, self.buffer_addresses.get(id(t))).index
        op = self.nodes[writer]
        siblings = sum(1 for n in self.nodes[writer:] if n.call_id == op.call_id)
        # Its value is the old value of `t` (the stale node) as changed by the write.
        node = self._new_node(t, "op", op.func_name, [(ref.node, 0), (writer, 1)], (),
                              op.output_index + siblings, op.call_id)
        node.is_inplace = True
        node.site = op.site
        node.func_args, node.rng_state = op.func_args, op.rng_state
        node.extra = {"view_written_by": writer}
        self._maybe_save(node, t)
        if watched:
            ref.version = _WATCHED  # the alias may be written again
        return node.index

    def record_external(self, name: str, inputs: list[tuple[torch.Tensor, Any]],
                        outputs: list[torch.Tensor], elapsed_ns: int = 0,
                        extra: dict | None = None, inplace: Sequence[bool] = ()) -> list[RawNode]:
        """Record an op that is not a torch function (a Triton kernel launch).

        `inputs` are (tensor, argument slot) pairs; `outputs` the tensors the op wrote,
        which from now on have this op as their producer; `inplace[i]` says whether the
        op also read `outputs[i]` (missing entries: False). Returns the new nodes.
        """
        with torch._C.DisableTorchFunction():
            parents: list = []
            params: list = []
            for t, slot in inputs:
                self._scan(t, slot, parents, params)
            self._call_count += 1
            nodes = []
            for output_index, t in enumerate(outputs):
                node = self._new_node(t, "op", name, parents, tuple(params), output_index,
                                      self._call_count)
                node.elapsed_ns = elapsed_ns
                node.extra = dict(extra or {})
                node.is_inplace = output_index < len(inplace) and inplace[output_index]
                self._maybe_save(node, t)
                nodes.append(node)
            return nodes

    def note_failure(self, name: str, inputs: Iterable[torch.Tensor]) -> None:
        """Note that an op outside torch functions (a kernel launch) raised, having received `inputs`.

        The first failing op of a pass is the one its partial history names; later ones
        are ignored. Inputs no logged op produced are left out of its parents.
        """
        if self._failed_op is None:
            with torch._C.DisableTorchFunction():
                inputs = tuple(inputs)
                refs = (self.producer.get(id(t)) for t in inputs)
                parents = [(ref.node, i) for i, ref in enumerate(refs) if ref is not None]
                self._note_failure(name, parents, inputs, {})

    def _note_failure(self, name: str, parents: list, args: tuple, kwargs: dict) -> None:
        """Keep what the partial history says of the op that raised: only the first one counts.

        Runs in the op's `except`, so the per-op path pays nothing for it.
        """
        if self._failed_op is None:
            nodes = tuple(dict.fromkeys(index for index, _ in parents))
            args_seen = failed_args(args, kwargs, parents, self._node_of, self._param_address)
            self._failed_op = (name, self.module_stack, nodes, self._call_site(sys._getframe(1)),
                               args_seen)

    def _node_of(self, t: torch.Tensor) -> int | None:
        ref = self.producer.get(id(t))
        return None if ref is None else ref.node

    def _param_address(self, t: torch.Tensor) -> str | None:
        info = self.param_info.get(id(t))
        return info if info is None or isinstance(info, str) else info.address

    # ----- interventions and stops (capture/plan.py) ---------------------------------------
    def _act(self, func: Callable, name: str, writes: bool, args: tuple, kwargs: dict, out: Any) -> Any:
        """Apply the plan's actions to the outputs of the op that just returned (its node is
        next); return what the model gets in place of `out`."""
        plan, call = self._plan, self._call_count + 1
        base = len(self.nodes)
        if not plan.at_ops and call not in self._act_calls and base not in self._act_nodes:
            return out
        outs = ((out, ()),) if type(out) is _Tensor else output_tensors(func, args, out)
        for output_index, (t, _) in enumerate(outs):
            index, label, acts = base + output_index, None, ()
            planned = plan.at_calls.get((call, output_index)) if plan.at_calls else None
            if planned is not None:
                expected, label, acts = planned
                self._check_ops(expected, index, name)
            guessed = plan.at_nodes.get(index) if plan.at_nodes else None
            if guessed is not None and guessed[0] == _layer_type(name):
                acts = tuple(sorted(acts + guessed[1], key=_act_number))
            if plan.at_ops:
                view = _new(OpView, (name, _layer_type(name), self.module_stack, tuple(t.shape),
                                     t.dtype, index, output_index))
                found = tuple(rule.act for rule in plan.at_ops if rule.test(view))
                if found:
                    acts = tuple(sorted(acts + found, key=_act_number))
            if not acts:
                continue
            new = t
            written = is_written(t, args, kwargs, writes)
            for act in acts:
                new = self._apply(act, new, Firing(act.site, index, name, None, label), written and new is t)
            if written and new is not t and (self._by_storage or self._copier is not None):
                self.before_write((t,))  # values saved from this memory keep what they held
            out = deliver(out, t, new, written, args)
        return out

    def _act_on_exit(self, call: tuple[str, int], output: Any, returned: list[int]) -> Any:
        """Apply the plan's actions on module call `call`'s output (each rule on the tensor it
        names, the first by default: the one `history[address]` finds); save the returned
        values the plan asks for; stop after the call if the plan says so."""
        plan = self._plan
        rules = plan.at_exits.get(call[0]) if plan.at_exits else None
        if rules:
            for output_index in sorted({r.output for r in rules if r.call is None or r.call == call[1]}):
                output = self._act_on_output(call, output, returned, output_index, rules)
        saves = plan.save_exits.get(call[0]) if plan.save_exits else None
        if saves is not None and (not saves or call[1] in saves):
            for index, t in zip(returned, self._returned_tensors(output)):
                node = self.nodes[index]
                if node.saved is None:
                    self._maybe_save(node, t, force=True)
        if plan.stop_exit == call:
            self.stopped_at = returned[-1] if returned else len(self.nodes) - 1
            raise StopCapture()
        return output

    def _act_on_output(self, call: tuple[str, int], output: Any, returned: list[int],
                       output_index: int, rules: tuple) -> Any:
        """The module's return value with its `output_index`-th tensor edited by the rules
        naming it (an error when it has no such tensor, or one the edit cannot reach)."""
        if output_index >= len(returned):
            raise StopCapture(InterventionError(outputs_missing(rules[0].act.site, call, output_index,
                                                                len(returned), output)))
        index = returned[output_index]
        node = self.nodes[index]
        view = OpView(node.func_name, _layer_type(node.func_name), node.module_path,
                      node.meta.shape, node.meta.dtype, index, node.output_index)
        acts = [r.act for r in rules if r.output == output_index and (r.call is None or r.call == call[1])
                and (r.test is None or r.test(view))]
        if not acts:
            return output
        self._check_order(acts, index, call)
        old = self._returned_tensors(output)[output_index]
        new = old
        shape = (output_index, len(returned))
        for act in acts:
            new = self._apply(act, new, Firing(act.site, index, node.func_name, call, None, shape))
        replaced = substitute(output, old, new)
        if new is not old and not any(t is new for t, _ in find_tensors(replaced)):
            raise StopCapture(InterventionError(unreachable(acts[0].site, call, output_index, len(returned),
                                                            type(output).__name__)))
        self._adopt(node, new)
        return replaced

    def _returned_tensors(self, output: Any) -> list[torch.Tensor]:
        """The tensors of a module's output that `_exit` numbered, in order: every one but a
        parameter no op made (which `_exit` leaves out of the call's outputs)."""
        producer, params = self.producer, self.param_info
        return [t for t, _ in find_tensors(output) if id(t) in producer or id(t) not in params]

    def _check_order(self, acts: list[Act], index: int, call: tuple[str, int]) -> None:
        """Refuse exit actions listed before an action that already changed the same value
        (at its op, or at the exit of an inner module returning it): `intervene`'s order
        cannot be kept, and acting anyway would apply them the other way round."""
        first = min(acts, key=_act_number)
        for fired in reversed(self.firings):
            if fired.firing.op_index == index and fired.number > first.number:
                raise StopCapture(InterventionError(out_of_order(
                    first.site, fired.firing.site, index, self.nodes[index].func_name, call)))

    def _apply(self, act: Act, value: torch.Tensor, firing: Firing, overwritten: bool = False) -> torch.Tensor:
        """`act`'s action on `value` (capture/plan.py's `run_action`), noted in `firings`."""
        new, record = run_action(act, value, firing, overwritten)
        self.firings.append(record)
        return new

    def _adopt(self, node: RawNode, new: torch.Tensor) -> None:
        """Make `new`, which replaced `node`'s tensor on its way out of a module, the value
        of `node`: readers downstream find `node` as its producer, and what is saved and
        hooked for gradients is `new`."""
        ref = _TensorRef(new, self._forget)
        ref.key, ref.node, ref.version = id(new), node.index, _version(new)
        self.producer[id(new)] = ref
        opts = self.options
        if node.saved is not None:
            self._saved_versions.pop(node.index, None)
            if opts.sink is not None:
                if opts.sink_settle is not None:  # the old value's write ends before the new one's
                    opts.sink_settle(node.index)
                node.saved = opts.sink(self.nodes, node.index, self._copy_for_saving(new))
            else:
                self._save(node, new)
        if opts.on_node is not None:
            opts.on_node(node, new)

    def _check_ops(self, expected: int, index: int, name: str) -> None:
        """Refuse to act unless this pass ran the logged pass's ops up to node `index`."""
        names, upto = self._plan.expected, min(index, len(self.nodes))
        ran = [node.func_name for node in self.nodes[self._checked:upto]]
        k = first_difference(names[self._checked:upto], ran)
        if k is not None:
            self._refuse(self._checked + k, ran[k] if k < len(ran) else name)
        if index != expected or (index < len(names) and names[index] != name):
            self._refuse(index, name)
        self._checked = index

    def _refuse(self, index: int, name: str) -> None:
        names = self._plan.expected
        then = repr(names[index]) if index < len(names) else "nothing"
        error = InterventionError(
            f"this pass ran other ops than the logged pass its label sites were found in: op "
            f"{index} is {name!r} where that pass had {then}, so no action was applied to a "
            "possibly wrong op; the model's ops depend on something besides its inputs and "
            "seed (state, or an earlier intervention changing control flow). Use a module "
            "address or a torchlog.select selector, which are found while the pass runs")
        error.torchlog_ops_changed = True
        raise StopCapture(error)

    def _stop_if_due(self, func: Callable, args: tuple, out: Any) -> None:
        """End the pass if the op `func` that returned `out` (its nodes just recorded) is where
        the plan stops: its `stop_node`, or the first op with an output `stop_on` accepts (the
        tensor a None-returning write wrote into counts as its output, as for the lean capture)."""
        plan = self._plan
        stop = plan.stop_node
        if stop is not None and len(self.nodes) > stop and not self._stop_missed:
            if plan.stop_type is not None:  # a guess: stop only where it holds
                if _layer_type(self.nodes[stop].func_name) != plan.stop_type:
                    self._stop_missed = True  # the API finds out on the finished history
                    return
            else:
                self._check_ops(stop, stop, self.nodes[stop].func_name)
            self.stopped_at = stop
            raise StopCapture()
        if plan.stop_on is not None and describe(func).name not in UNDEFINED_VALUES:
            with torch._C.DisableTorchFunction():  # the test's own ops are not the model's
                due = any(plan.stop_on(t) for t, _ in output_tensors(func, args, out))
            if due:
                self.stopped_at = len(self.nodes) - 1
                raise StopCapture()

    # ----- module boundaries ------------------------------------------------------------
    def enter(self, address: str, frame: Any) -> None:
        """Module `address` starts a call; `frame` runs its forward (capture/boundaries.py)."""
        count = self.module_calls.get(address, 0) + 1
        self.module_calls[address] = count
        self.module_stack = self.module_stack + ((address, count),)
        self.module_sites = self.module_sites + (self._call_site(module_caller(frame)),)
        self.module_frames = self.module_frames + (frame,)

    def act_on_inputs(self, address: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """What module `address` (the call just entered) receives, with the plan's
        module-input actions applied; the replacement reads as the value's own node to the
        module's ops, and every other reader keeps the value as it was."""
        call = self.module_stack[-1]
        rules = [r for r in self._plan.at_entries.get(address, ()) if r.call is None or r.call == call[1]]
        if not rules:
            return args, kwargs
        with torch._C.DisableTorchFunction():
            found = [t for t, _ in find_tensors((args, kwargs)) if id(t) not in self.param_info]
            for index in sorted({r.output for r in rules}):
                acts = sorted((r.act for r in rules if r.output == index), key=_act_number)
                if index >= len(found):
                    raise StopCapture(InterventionError(inputs_missing(acts[0].site, call, index, len(found))))
                old = found[index]
                ref = self.producer.get(id(old))
                node = self.nodes[self._current_node(old, ref) if ref is not None else self._source_for(old)]
                new = old
                for act in acts:
                    new = self._apply(act, new, Firing(act.site, node.index, node.func_name, call, None, None,
                                                       (index, len(found))))
                if new is not old:
                    args, kwargs = substitute((args, kwargs), old, new)
                    ref = _TensorRef(new, self._forget)
                    ref.key, ref.node, ref.version = id(new), node.index, _version(new)
                    self.producer[id(new)] = ref
        return args, kwargs

    def leave(self, address: str, output: Any) -> Any:
        """Module `address` returned `output`; returns what its caller gets (`output`, or
        `output` with an intervention's replacement in it)."""
        with torch._C.DisableTorchFunction():
            return self._exit(address, output)

    def leave_raised(self, address: str) -> None:
        """Module `address` raised (or an exception passed through it)."""
        if self._error_stack is None:
            self._error_stack = self.module_stack  # the deepest module the exception passed through
        with torch._C.DisableTorchFunction():
            self._exit(address, None)

    def _exit(self, address: str, output: Any) -> Any:
        stack = self.module_stack
        depth = len(stack) - 1
        while depth >= 0 and stack[depth][0] != address:
            depth -= 1
        if depth < 0:
            return output
        call = stack[depth]
        self.module_stack = stack[:depth]
        self.module_sites = self.module_sites[:depth]
        self.module_frames = self.module_frames[:depth]
        returned: list[int] = []  # in the order of the returned structure
        for t, _ in find_tensors(output):
            ref = self.producer.get(id(t))
            if ref is None and id(t) in self.param_info:
                continue
            index = self._current_node(t, ref) if ref is not None else self._source_for(t)
            self.nodes[index].output_of.append(call)
            returned.append(index)
        self.call_outputs[call] = returned
        if self._acting_exits and output is not None:
            output = self._act_on_exit(call, output, returned)
        return output

    # ----- start and end ------------------------------------------------------------------
    def add_outputs(self, output: Any) -> None:
        """Add one output node per tensor the model returned."""
        returned = find_tensors(output)
        # Every parent before any output node: a new node becomes its tensor's producer, and
        # a tensor returned twice (`return y, y`) must not get an output as its parent.
        parents = []
        for t, _ in returned:
            ref = self.producer.get(id(t))
            parents.append(self._current_node(t, ref) if ref is not None else self._source_for(t))
        for (t, path), parent in zip(returned, parents):
            node = self._new_node(t, "output", "output", [(parent, path)], ())
            if self.options.save_all or node.index in self.options.save_indices:
                prior = self.nodes[parent].saved
                node.saved = prior if prior is not None else self._copy_for_saving(t)
                if prior is not None and parent in self._saved_versions:
                    self._reference(node.index, t, self._saved_versions[parent])

    def finish(self, modules: tuple[ModuleInfo, ...], error: Exception | None) -> CapturedPass:
        """The pass as plain data for assembly; `error` is what forward raised, if it did."""
        if self._copier is not None:  # every saved value complete before anyone reads it
            self._copier.wait_all()
        failure = None
        if error is not None:
            name, stack, parents, site, args = self._failed_op or (
                None, self._error_stack or (), (), None, ())
            failure = Failure(error, name, stack, parents, site, args)
        outputs = {call: tuple(nodes) for call, nodes in self.call_outputs.items()}
        return CapturedPass(tuple(self.nodes), dict(self.module_calls), outputs, modules, failure,
                            self.stale_saves(), tuple(self.firings), self.stopped_at)
