"""Selectors: name passes by function, module, label or predicate, combined with `&`, `|` and `~`.

One selector serves `layers_to_save`, `extract(layers=...)` and `intervene`. Each can say
which passes of a finished history it names (`passes_in`), and most can also decide while
the pass runs, op by op, which is what lets an intervention act without a first logged
pass. When it decides is its `stage`:

- 'op': decided when each op returns, from what is known then (`OpView`: function,
  enclosing modules, shape, dtype, position): `func`, `in_module`, `where`, and `&`, `|`,
  `~` of those.
- 'exit': decided when a module returns (the passes that are its outputs): `module`,
  `module_type`, and those `&` op-stage selectors (tested on the output's op).
- 'pass': needs a logged pass first: `label`, and combinations that mix stages
  otherwise (`~module(...)`, `module(...) | func(...)`).

Example:
    >>> from torchlog import select
    >>> site = select.func('softmax') & select.in_module('h.1.attn')
    >>> site, site.stage
    (func('softmax') & in_module('h.1.attn'), 'op')
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchlog.capture import OpView
from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError
from torchlog.labels import layer_type_of
from torchlog.records import LayerRecord, PassRecord

ModelHistory = Any  # a torchlog.history.ModelHistory; the history sits above the selectors

__all__ = ["OpView", "Selector", "func", "in_module", "label", "module", "module_input", "module_type", "where"]


def view_of(record: PassRecord) -> OpView:
    """The OpView of a finished pass, so post-hoc selection tests what a live one would."""
    path = tuple(_call_of(text) for text in reversed(record.containing_modules))
    return OpView(record.func_name, record.layer_type, path, tuple(record.tensor_meta.shape),
                  record.tensor_meta.dtype, record.op_index, record.output_index)


def _call_of(text: str) -> tuple[str, int]:
    """('h.0', 2) from 'h.0:2'."""
    address, _, call = text.rpartition(":")
    return address, int(call)


def _outputs_of(record: PassRecord) -> list[tuple[str, int]]:
    return [_call_of(text) for text in record.output_of_modules]


_OPS = ("op", "created")


class Selector:
    """A rule naming passes; combine with `&`, `|`, `~`. Build with the functions of this module."""

    stage = "pass"

    def passes_in(self, history: ModelHistory) -> set[int]:
        """Op indexes of the passes of a finished history (every pass of its run) it names."""
        everything = history.info.all_passes  # those layers_to_save left out too
        passes = history.passes if everything is None else everything
        return {p.op_index for p in passes if self._matches_record(p, history)}

    def op_test(self, types: dict[str, str]) -> Callable[[OpView], bool]:
        """A test of one live op (stage 'op', or the op-stage part of an 'exit' selector);
        `types` maps module addresses to class names."""
        raise NotImplementedError(f"{self!r} is decided after a pass, not op by op")

    def exit_test(self, types: dict[str, str]) -> Callable[[str, int], bool]:
        """A test of one module call (address, call number) whose outputs it names (stage 'exit')."""
        raise NotImplementedError(f"{self!r} is not decided at module exits")

    def _matches_record(self, record: PassRecord, history: ModelHistory) -> bool:
        raise NotImplementedError

    def __and__(self, other: Any) -> Selector:
        return _And(self, _checked(other, "&"))

    def __rand__(self, other: Any) -> Selector:
        return _And(_checked(other, "&"), self)

    def __or__(self, other: Any) -> Selector:
        return _Or(self, _checked(other, "|"))

    def __ror__(self, other: Any) -> Selector:
        return _Or(_checked(other, "|"), self)

    def __invert__(self) -> Selector:
        return _Not(self)

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and repr(self) == repr(other)

    def __hash__(self) -> int:
        return hash(repr(self))


def _checked(other: Any, operator: str) -> Selector:
    if not isinstance(other, Selector):
        raise InvalidArgumentTypeError(
            f"a selector can only be combined with another selector by {operator!r}, got "
            f"{other!r} of type {type(other).__name__}; wrap a label as select.label({other!r}) "
            f"or a module address as select.module({other!r})")
    return other


def _in_types(address: str, types: dict[str, str], type_name: str) -> bool:
    return types.get(address) == type_name


class _Func(Selector):
    stage = "op"

    def __init__(self, name: str) -> None:
        self.name, self.layer_type = name, layer_type_of(name)

    def op_test(self, types: dict[str, str]) -> Callable[[OpView], bool]:
        wanted = self.layer_type
        return lambda op: op.layer_type == wanted

    def _matches_record(self, record: PassRecord, history: ModelHistory) -> bool:
        return record.kind.value in _OPS and record.layer_type == self.layer_type

    def __repr__(self) -> str:
        return f"func({self.name!r})"


class InModuleSelector(Selector):
    """Ops run inside a module (`in_module`); the planner reads its `address`."""

    stage = "op"

    def __init__(self, address: str) -> None:
        self.address = address

    def op_test(self, types: dict[str, str]) -> Callable[[OpView], bool]:
        address = self.address

        def inside(op: OpView) -> bool:
            for enclosing, _ in op.module_path:  # a loop, not any(): it runs on every op
                if enclosing == address:
                    return True
            return False

        return inside

    def _matches_record(self, record: PassRecord, history: ModelHistory) -> bool:
        return record.kind.value in _OPS and any(_call_of(t)[0] == self.address for t in record.containing_modules)

    def __repr__(self) -> str:
        return f"in_module({self.address!r})"


class WhereSelector(Selector):
    """Ops a predicate on their `OpView` accepts (`where`)."""

    stage = "op"

    def __init__(self, predicate: Callable[[OpView], Any]) -> None:
        self.predicate = predicate

    def op_test(self, types: dict[str, str]) -> Callable[[OpView], bool]:
        predicate = self.predicate
        return lambda op: bool(predicate(op))

    def _matches_record(self, record: PassRecord, history: ModelHistory) -> bool:
        return record.kind.value in _OPS and bool(self.predicate(view_of(record)))

    def __repr__(self) -> str:
        return f"where({getattr(self.predicate, '__name__', 'predicate')})"


class ModuleSelector(Selector):
    """A module call's output (`module`): its `address`, `call` (None: every call) and `output` index."""

    stage = "exit"

    def __init__(self, address: str, call: int | None = None, output: int | None = None) -> None:
        self.address, self.call, self.output = address, call, output

    def exit_test(self, types: dict[str, str]) -> Callable[[str, int], bool]:
        address, call = self.address, self.call
        return lambda a, c: a == address and (call is None or c == call)

    def passes_in(self, history: ModelHistory) -> set[int]:
        if self.output is None:
            return super().passes_in(history)
        module = history.modules.get(self.address)
        calls = module.call_outputs if module is not None else ()
        everything = history.info.all_passes
        by_label = {p.label: p for p in (history.passes if everything is None else everything)}
        return {by_label[returned[self.output]].op_index for number, returned in enumerate(calls, 1)
                if (self.call is None or number == self.call) and self.output < len(returned)
                and returned[self.output] in by_label}

    def _matches_record(self, record: PassRecord, history: ModelHistory) -> bool:
        if self.output is not None:
            return record.op_index in self.passes_in(history)
        return any(a == self.address and (self.call is None or c == self.call)
                   for a, c in _outputs_of(record))

    def __repr__(self) -> str:
        args = [repr(self.address)] + ([str(self.call)] if self.call is not None else [])
        if self.output is not None:
            args.append(f"output={self.output}")
        return f"module({', '.join(args)})"


class ModuleInputSelector(Selector):
    """What a module call receives: the `index`-th tensor of its arguments."""

    stage = "entry"

    def __init__(self, address: str, call: int | None = None, index: int = 0) -> None:
        self.address, self.call, self.index = address, call, index

    def passes_in(self, history: ModelHistory) -> set[int]:
        raise InvalidOptionError(
            f"{self!r} names what a module receives, which is an intervention site, not a pass of "
            "the history; to save or find it, name the op that made it (its label) or the "
            "module's output before it")

    def __repr__(self) -> str:
        args = [repr(self.address)] + ([str(self.call)] if self.call is not None else [])
        if self.index:
            args.append(f"index={self.index}")
        return f"module_input({', '.join(args)})"


class ModuleTypeSelector(Selector):
    """The outputs of every module of one type (`module_type`)."""

    stage = "exit"

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

    def exit_test(self, types: dict[str, str]) -> Callable[[str, int], bool]:
        type_name = self.type_name
        return lambda a, c: _in_types(a, types, type_name)

    def _matches_record(self, record: PassRecord, history: ModelHistory) -> bool:
        modules = history.modules
        return any(a in modules and modules[a].type_name == self.type_name for a, _ in _outputs_of(record))

    def __repr__(self) -> str:
        return f"module_type({self.type_name!r})"


class _Label(Selector):
    def __init__(self, text: str) -> None:
        self.text = text

    def passes_in(self, history: ModelHistory) -> set[int]:
        if self.text not in history:
            return set()
        found = history[self.text]
        passes = found.passes if isinstance(found, LayerRecord) else (found,)
        return {p.op_index for p in passes}

    def _matches_record(self, record: PassRecord, history: ModelHistory) -> bool:
        return record.op_index in self.passes_in(history)

    def __repr__(self) -> str:
        return f"label({self.text!r})"


class _And(Selector):
    def __init__(self, left: Selector, right: Selector) -> None:
        self.left, self.right = left, right
        stages = {left.stage, right.stage}
        self.stage = "pass" if "pass" in stages or stages == {"exit"} else \
            ("exit" if "exit" in stages else "op")

    def op_test(self, types: dict[str, str]) -> Callable[[OpView], bool]:
        parts = [s.op_test(types) for s in (self.left, self.right) if s.stage == "op"]
        return lambda op: all(test(op) for test in parts)

    def exit_test(self, types: dict[str, str]) -> Callable[[str, int], bool]:
        (exit_part,) = [s for s in (self.left, self.right) if s.stage == "exit"]
        return exit_part.exit_test(types)

    def _matches_record(self, record: PassRecord, history: ModelHistory) -> bool:
        return self.left._matches_record(record, history) and self.right._matches_record(record, history)

    def __repr__(self) -> str:
        return f"{_wrapped(self.left, _Or)} & {_wrapped(self.right, _Or)}"


class _Or(Selector):
    def __init__(self, left: Selector, right: Selector) -> None:
        self.left, self.right = left, right
        self.stage = "op" if left.stage == right.stage == "op" else "pass"

    def op_test(self, types: dict[str, str]) -> Callable[[OpView], bool]:
        first, second = self.left.op_test(types), self.right.op_test(types)
        return lambda op: first(op) or second(op)

    def _matches_record(self, record: PassRecord, history: ModelHistory) -> bool:
        return self.left._matches_record(record, history) or self.right._matches_record(record, history)

    def __repr__(self) -> str:
        return f"{self.left!r} | {self.right!r}"


class _Not(Selector):
    def __init__(self, inner: Selector) -> None:
        self.inner = inner
        self.stage = "op" if inner.stage == "op" else "pass"

    def op_test(self, types: dict[str, str]) -> Callable[[OpView], bool]:
        test = self.inner.op_test(types)
        return lambda op: not test(op)

    def _matches_record(self, record: PassRecord, history: ModelHistory) -> bool:
        return record.kind.value in _OPS and not self.inner._matches_record(record, history)

    def __repr__(self) -> str:
        return f"~{_wrapped(self.inner, (_And, _Or))}"


def _wrapped(selector: Selector, kinds: Any) -> str:
    return f"({selector!r})" if isinstance(selector, kinds) else repr(selector)


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgumentTypeError(f"select.{what} takes a non-empty str, got {value!r}")
    return value


def func(name: str) -> Selector:
    """Every pass of an op of this function, by the label's type: `func('add')` finds `x + y`
    (`__add__`), `torch.add` and `x.add_(y)`; `func('softmax')` every softmax."""
    return _Func(_text(name, "func"))


def in_module(address: str) -> Selector:
    """Every op run inside module `address`, at any depth (not the module's inputs)."""
    return InModuleSelector(_text(address, "in_module"))


def module(address: str, call: int | None = None, output: int | None = None) -> Selector:
    """The passes that are module `address`'s outputs: of every call, or of call `call`
    (1-based); of every tensor it returns, or only of tensor `output` (0-based, in the order
    of the returned structure: `module('lstm', output=1)` is an `nn.LSTM`'s `h_n`).

    As an intervention site, a module acts on one tensor of what it returns: `output`, or
    the first one (a Hugging Face block's hidden states) when not given. Each firing
    records which (`output 0 of 3`).
    """
    if call is not None and (isinstance(call, bool) or not isinstance(call, int) or call < 1):
        raise InvalidArgumentTypeError(f"select.module call must be an int >= 1 or None, got {call!r}")
    if output is not None and (isinstance(output, bool) or not isinstance(output, int) or output < 0):
        raise InvalidArgumentTypeError(f"select.module output must be an int >= 0 or None, got {output!r}")
    return ModuleSelector(_text(address, "module"), call, output)


def module_input(address: str, call: int | None = None, index: int = 0) -> Selector:
    """What module `address` receives: the `index`-th tensor of its arguments (positional
    first, then keywords, in order), at every call or at call `call`. As an intervention
    site it changes the value the module's forward gets, after the user's own forward
    pre-hooks, as TransformerLens's `hook_resid_pre` or nnsight's `.input` do; the value
    stays what it was for every other reader. It is not a pass of the history: the firing
    is recorded on the pass that made the value (`history.interventions`).
    """
    if call is not None and (isinstance(call, bool) or not isinstance(call, int) or call < 1):
        raise InvalidArgumentTypeError(f"select.module_input call must be an int >= 1 or None, got {call!r}")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise InvalidArgumentTypeError(f"select.module_input index must be an int >= 0, got {index!r}")
    return ModuleInputSelector(_text(address, "module_input"), call, index)


def module_type(type_name: str) -> Selector:
    """The outputs of every module of this class name (`module_type('GPT2Block')`)."""
    return ModuleTypeSelector(_text(type_name, "module_type"))


def label(text: str) -> Selector:
    """The pass or layer a label names (`'linear_1_1'`: every pass; `'linear_1_1:2'`: one);
    needs a logged pass to resolve."""
    return _Label(_text(text, "label"))


def where(predicate: Callable[[OpView], Any]) -> Selector:
    """Every op for which `predicate(op)` is true; `op` is an OpView (function, layer type,
    enclosing modules, shape, dtype, op index), what is known when the op returns."""
    if not callable(predicate):
        raise InvalidArgumentTypeError(f"select.where takes a callable (OpView -> bool), got {predicate!r}")
    return WhereSelector(predicate)
