"""Small models made of the op kinds a plan must be honoured on, each carrying its own oracle.

Every step is a module with one key op (an `out=` op, an in-place op, `t.data = v`, a write
through a view, `t[i] = v`, a module returning a tuple, an LSTM, a loop). Right after the key
op its forward calls `self.tap(...)`: in a plain run nothing happens there, and with an edit
set (`Composed.edit`) the edit is applied in plain PyTorch at that point of the code, written
into the op's memory where the model keeps using that memory (`tap_into`), so an executor's
intervention can be checked against the model's own code doing the same edit. With
`Composed.seen` set, the tap also keeps a copy of each value (the oracle of saving).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from torchlog.history import ModelHistory, all_passes
from torchlog.records import NodeKind, PassRecord

Edit = Callable[[torch.Tensor], torch.Tensor]

WIDTH = 4  # every step takes and returns a (rows, WIDTH) tensor


class Step(nn.Module):
    """One step of a composed model; `key_func` is the layer type of its key op, `written`
    whether that op writes into memory the model keeps reading."""

    key_func = ""
    written = False

    def __init__(self) -> None:
        super().__init__()
        self.edits: dict[int | None, Edit] = {}  # tap call number (None: every call) -> edit
        self.seen: list[torch.Tensor] | None = None  # copies of the key op's values, when kept
        self.num_taps = 0

    def tap(self, t: torch.Tensor) -> torch.Tensor:
        """The key op's value as the rest of forward uses it: edited when an edit is set."""
        self.num_taps += 1
        edit = self.edits.get(self.num_taps, self.edits.get(None))
        if edit is not None:
            t = edit(t)
        if self.seen is not None:
            self.seen.append(t.detach().clone())
        return t

    def tap_into(self, t: torch.Tensor) -> None:
        """As `tap`, for a value the model keeps reading through `t`: the edit is written into it."""
        new = self.tap(t)
        if new is not t:
            t.copy_(new)


class Linear(Step):
    key_func = "linear"

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.tap(self.fc(h)).tanh()


class OutAdd(Step):
    """`torch.add(h, 1, out=c)`, its result ignored: the model reads `c`."""

    key_func = "add"
    written = True

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        c = torch.empty_like(h)
        torch.add(h, 1, out=c)
        self.tap_into(c)
        return c * 0.5


class Relu_(Step):
    key_func = "relu"
    written = True

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h * 2
        h.relu_()
        self.tap_into(h)
        return h - 0.25


class Add_(Step):
    key_func = "add"
    written = True

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h - 0.25
        h.add_(1)
        self.tap_into(h)
        return h.sin()


class SetData(Step):
    """`t.data = v`: the model reads `t`, whose memory is now `v`'s."""

    key_func = "setdata"
    written = True

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        t = torch.zeros_like(h)
        t.data = h * 2
        self.tap_into(t)
        return t + 1


class ViewMul_(Step):
    """`v = h[0]; v.mul_(2)`: a write through a view, read through its base."""

    key_func = "mul"
    written = True

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h - 1.5
        v = h[0]
        v.mul_(2)
        self.tap_into(v)
        return h.cos()


class SetItem(Step):
    """`h[1] = h[1] + 3`: a write by `__setitem__`, which returns nothing."""

    key_func = "setitem"
    written = True

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h * 1.0
        h[1] = h[1] + 3
        self.tap_into(h)
        return h * h


class Pair(nn.Module):
    """A module returning a tuple of two tensors."""

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return h.sin(), h.cos()


class Tuple(Step):
    """A submodule `pair` returning (a, b), both read."""

    key_func = "mul"  # the op combining the pair

    def __init__(self) -> None:
        super().__init__()
        self.pair = Pair()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        a, b = self.pair(h)
        return self.tap(a * (b + 2)) - 0.5


class Lstm(Step):
    """An nn.LSTM, whose output `(out, (h_n, c_n))` is read in two parts."""

    key_func = "add"

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(WIDTH, WIDTH, batch_first=True)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out, (h_n, _) = self.lstm(h.unsqueeze(0))
        return self.tap(out[0] + h_n[0]).tanh()


class Loop(Step):
    """One Linear called three times, each followed by `+ 1` (the key op, once per pass)."""

    key_func = "add"
    num_passes = 3

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for _ in range(self.num_passes):
            h = self.tap(self.fc(h) + 1)
        return h * 0.5


STEPS: dict[str, type[Step]] = {
    "linear": Linear, "out=": OutAdd, "relu_": Relu_, "add_": Add_, "t.data": SetData,
    "view write": ViewMul_, "setitem": SetItem, "tuple": Tuple, "lstm": Lstm, "loop": Loop,
}


class Composed(nn.Module):
    """`steps[0]`, then `steps[1]`, ..., with a residual read of each step's input, so a
    step's input has another reader besides the step (a module-input edit must not reach it)."""

    def __init__(self, kinds: Sequence[str]) -> None:
        super().__init__()
        self.kinds = tuple(kinds)
        self.steps = nn.ModuleList([STEPS[kind]() for kind in kinds])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for step in self.steps:
            h = step(h) + 0.1 * h
        return h

    def edit(self, index: int, edit: Edit | None, call: int | None = None) -> None:
        """Set (or clear, with None) the edit of step `index`'s key op at tap call `call`."""
        for step in self.steps:
            step.edits = {}
        if edit is not None:
            self.steps[index].edits = {call: edit}

    def keep_values(self, keep: bool) -> None:
        for step in self.steps:
            step.seen = [] if keep else None

    def reset_taps(self) -> None:
        for step in self.steps:
            step.num_taps = 0


def make(kinds: Sequence[str], seed: int = 0) -> tuple[Composed, torch.Tensor]:
    """A Composed model of `kinds` and an input for it, both from `seed`."""
    torch.manual_seed(seed)
    model = Composed(kinds).eval()
    return model, torch.randn(2, WIDTH)


def oracle_output(model: Composed, x: torch.Tensor, index: int | None = None, edit: Edit | None = None,
                  call: int | None = None) -> torch.Tensor:
    """The model's output with `edit` applied by its own code at step `index`'s key op."""
    model.reset_taps()
    model.edit(index if index is not None else 0, edit, call)
    try:
        with torch.no_grad():
            return model(x.clone())
    finally:
        model.edit(0, None)
        model.reset_taps()


def hooked_output(model: nn.Module, x: Any, address: str, edit: Edit, call: int | None = None,
                  output: int | tuple[int, ...] = 0, on_input: bool = False) -> Any:
    """The model's output with `edit` applied by a plain forward hook (or, `on_input`, a
    forward pre-hook) to tensor `output` (or each of several) of module `address`'s output
    (or its input) at call `call` (None: every call)."""
    handle = hook(model, address, edit, call, output, on_input)
    try:
        with torch.no_grad():
            return model(x.clone() if isinstance(x, torch.Tensor) else x)
    finally:
        handle.remove()


def hook(model: nn.Module, address: str, edit: Edit, call: int | None = None,
         output: int | tuple[int, ...] = 0, on_input: bool = False) -> Any:
    """The handle of the forward hook (or pre-hook) `hooked_output` runs the model with."""
    module = model.get_submodule(address)
    calls = [0]

    def change(value: Any) -> Any:
        calls[0] += 1
        if call is not None and calls[0] != call:
            return None
        flat = _flatten(value)
        for index in (output,) if isinstance(output, int) else output:
            value = _rebuilt(value, flat[index], edit(flat[index]))
        return value

    if on_input:  # the tensors of positional, then keyword arguments, as torchlog counts them
        def before(m: nn.Module, args: tuple, kwargs: dict) -> Any:
            changed = change((args, tuple(kwargs.values())))
            if changed is None:
                return None
            return changed[0], dict(zip(kwargs, changed[1]))

        return module.register_forward_pre_hook(before, with_kwargs=True)
    return module.register_forward_hook(lambda m, args, out: change(out))


def _flatten(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _flatten(item)]
    return []


def _rebuilt(value: Any, old: torch.Tensor, new: torch.Tensor) -> Any:
    if value is old:
        return new
    if isinstance(value, (tuple, list)):
        return type(value)(_rebuilt(item, old, new) for item in value)
    return value


def key_passes(history: ModelHistory, model: Composed, index: int) -> list[PassRecord]:
    """The passes of step `index`'s key op in a history of `model` (the values its tap sees), in order."""
    func, inside = model.steps[index].key_func, f"steps.{index}"
    return [p for p in all_passes(history) if p.layer_type == func and p.kind in (NodeKind.OP, NodeKind.CREATED)
            and "view_written_by" not in p.extra
            and any(text.rpartition(":")[0] == inside for text in p.containing_modules)]


class Calls:
    """Counts every module's calls (by address, '' for the model) with forward pre-hooks while entered."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.counts, self.handles = model, {}, []

    def __enter__(self) -> dict[str, int]:
        for address, module in self.model.named_modules():
            self.handles.append(module.register_forward_pre_hook(self._counter(address)))
        return self.counts

    def _counter(self, address: str) -> Callable:
        def count(module: nn.Module, args: Any) -> None:
            self.counts[address] = self.counts.get(address, 0) + 1
        return count

    def __exit__(self, *exc_info: object) -> None:
        for handle in self.handles:
            handle.remove()


class EditCalls(TorchFunctionMode):
    """Plain PyTorch's own way to reach an op inside a module: edit the output of the
    `calls`-th calls of `func` (None: every call) as forward runs."""

    def __init__(self, func: Callable, calls: set[int] | None, edit: Edit) -> None:
        super().__init__()
        self.func, self.calls, self.edit, self.count = func, calls, edit, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is self.func:
            self.count += 1
            if self.calls is None or self.count in self.calls:
                out = self.edit(out)
        return out
