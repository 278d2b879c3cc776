"""Random models built from loops, module calls, parameter-free ops and branches, together with
the layers torchlog must fold them into, known from how each model was put together.

A program is a tree of statements acting on one carried tensor `x`. It becomes real Python
source (compiled, so every statement is its own instruction, its own program point) and a
model whose `forward` runs it. `expected_labels` walks the same tree and lists, in execution
order, which program point each op comes from; the layers follow from the rule in
docs/design.md: ops sharing parameters are one layer, and so is every parameter-free
program point run more than once along the carried chain. Generated programs keep to that
rule's plain cases: every op inside a loop runs at least twice (loop counts of 2 to 4, the
every-other-pass branch only inside 4-pass loops) and every op reads the carried value.
"""
from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass

import torch
from hypothesis import strategies as st
from torch import nn

from torchlog.labels import layer_label, pass_label

# Parameter-free ops on the carried value: source template and layer type.
OPS = {
    "sin": ("torch.sin({})", "sin"),
    "cos": ("torch.cos({})", "cos"),
    "tanh": ("torch.tanh({})", "tanh"),
    "sigmoid": ("torch.sigmoid({})", "sigmoid"),
    "half": ("{} * 0.5", "mul"),
    "shift": ("{} + 1.0", "add"),
    "plus_input": ("{} + inp", "add"),  # reads a loop-invariant tensor
}
MODULE_KINDS = ("linear", "block", "act")  # shared Linear, Linear inside a module, nn.Tanh
NUM_MODULES = 3
MAX_DEPTH = 3


@dataclass(frozen=True)
class Op:
    kind: str  # key of OPS


@dataclass(frozen=True)
class Fork:
    left: str  # x = left(x) + right(x)
    right: str


@dataclass(frozen=True)
class Call:
    module: int  # x = self.m{module}(x)


@dataclass(frozen=True)
class Loop:
    count: int
    body: tuple


@dataclass(frozen=True)
class EveryOther:
    body: tuple  # runs on odd passes of the innermost loop, which has 4 passes


@dataclass(frozen=True)
class Flag:
    taken: bool  # a branch fixed when the model is built
    body: tuple


@dataclass(frozen=True)
class Accumulate:
    count: int  # acc = zeros; `count` times: acc = acc + sin(x), x = x * 0.5; x = x + acc


@dataclass(frozen=True)
class Program:
    modules: tuple[str, ...]  # kind of each module self.m0, self.m1, ...
    body: tuple


class Block(nn.Module):
    """A module with parameters and a parameter-free op of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


class Generated(nn.Module):
    """Holds a program's modules and branch flags; `forward` is compiled per program."""

    def __init__(self, modules: tuple[str, ...], flags: list[bool]) -> None:
        super().__init__()
        for index, kind in enumerate(modules):
            made = {"linear": lambda: nn.Linear(3, 3), "block": Block, "act": nn.Tanh}[kind]()
            self.add_module(f"m{index}", made)
        self.flags = flags


# ----- generating programs -------------------------------------------------------------------
_leaf = st.one_of(
    st.builds(Op, st.sampled_from(sorted(OPS))),
    st.builds(Fork, st.sampled_from(sorted(OPS)), st.sampled_from(sorted(OPS))),
    st.builds(Call, st.integers(0, NUM_MODULES - 1)),
)


@st.composite
def blocks(draw: st.DrawFn, depth: int = 0, loop_count: int | None = None) -> tuple:
    """A block of 1-3 statements inside `depth` loops, the innermost running `loop_count` times."""
    kinds = ["leaf", "leaf", "flag"]
    if depth < MAX_DEPTH:
        kinds += ["loop", "loop", "accumulate"]
    if loop_count == 4:
        kinds.append("every_other")
    statements = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(kinds))
        if kind == "leaf":
            statements.append(draw(_leaf))
        elif kind == "loop":
            count = draw(st.integers(2, 4))
            statements.append(Loop(count, draw(blocks(depth + 1, count))))
        elif kind == "accumulate":
            statements.append(Accumulate(draw(st.integers(2, 4))))
        elif kind == "every_other":
            statements.append(EveryOther(draw(blocks(depth, loop_count))))
        else:
            statements.append(Flag(draw(st.booleans()), draw(blocks(depth, loop_count))))
    return tuple(statements)


programs = st.builds(Program, st.tuples(*[st.sampled_from(MODULE_KINDS)] * NUM_MODULES), blocks())


# ----- source code and model -----------------------------------------------------------------
def build(program: Program) -> nn.Module:
    """The model that runs `program`; each build compiles fresh code (new program points)."""
    lines = ["def forward(self, x):", "    inp = x"]
    flags: list[bool] = []
    _emit(program.body, lines, flags, indent=1, loops=[])
    lines.append("    return x")
    namespace: dict = {"torch": torch}
    exec(compile("\n".join(lines) + "\n", "<generated loop program>", "exec"), namespace)
    cls = type("GeneratedModel", (Generated,), {"forward": namespace["forward"]})
    return cls(program.modules, flags)


def _emit(body: tuple, lines: list[str], flags: list[bool], indent: int, loops: list[str]) -> None:
    pad = "    " * indent
    for statement in body:
        if isinstance(statement, Op):
            lines.append(f"{pad}x = {OPS[statement.kind][0].format('x')}")
        elif isinstance(statement, Fork):
            left, right = (OPS[k][0].format("x") for k in (statement.left, statement.right))
            lines.append(f"{pad}x = ({left}) + ({right})")
        elif isinstance(statement, Call):
            lines.append(f"{pad}x = self.m{statement.module}(x)")
        elif isinstance(statement, Loop):
            var = f"i{len(lines)}"
            lines.append(f"{pad}for {var} in range({statement.count}):")
            _emit(statement.body, lines, flags, indent + 1, loops + [var])
        elif isinstance(statement, EveryOther):
            lines.append(f"{pad}if {loops[-1]} % 2 == 1:")
            _emit(statement.body, lines, flags, indent + 1, loops)
        elif isinstance(statement, Flag):
            lines.append(f"{pad}if self.flags[{len(flags)}]:")
            flags.append(statement.taken)
            _emit(statement.body, lines, flags, indent + 1, loops)
        else:
            _emit_accumulate(statement, lines, pad)


def _emit_accumulate(statement: Accumulate, lines: list[str], pad: str) -> None:
    acc = f"acc{len(lines)}"
    lines += [f"{pad}{acc} = torch.zeros_like(x)",
              f"{pad}for _ in range({statement.count}):",
              f"{pad}    {acc} = {acc} + torch.sin(x)",
              f"{pad}    x = x * 0.5",
              f"{pad}x = x + {acc}"]


# ----- what torchlog must make of it -----------------------------------------------------------
def ops_run(program: Program) -> list[tuple[Hashable, str]]:
    """(program point, layer type) of every op the program runs, in execution order."""
    return list(_run(program.body, program.modules, (), []))


def _run(body: tuple, modules: tuple[str, ...], where: tuple, passes: list[int]
         ) -> Iterator[tuple[Hashable, str]]:
    for position, statement in enumerate(body):
        point = where + (position,)  # where the statement sits in the program text
        if isinstance(statement, Op):
            yield point, OPS[statement.kind][1]
        elif isinstance(statement, Fork):
            yield point + ("left",), OPS[statement.left][1]
            yield point + ("right",), OPS[statement.right][1]
            yield point + ("add",), "add"
        elif isinstance(statement, Call):
            yield from _call(statement.module, modules[statement.module], point)
        elif isinstance(statement, Loop):
            for k in range(statement.count):
                yield from _run(statement.body, modules, point, passes + [k])
        elif isinstance(statement, EveryOther):
            if passes[-1] % 2 == 1:
                yield from _run(statement.body, modules, point, passes)
        elif isinstance(statement, Flag):
            if statement.taken:
                yield from _run(statement.body, modules, point, passes)
        else:
            yield point + ("zeros",), "zeroslike"
            for _ in range(statement.count):
                yield point + ("sin",), "sin"
                yield point + ("acc",), "add"
                yield point + ("half",), "mul"
            yield point + ("out",), "add"


def _call(index: int, kind: str, point: tuple) -> Iterator[tuple[Hashable, str]]:
    if kind in ("linear", "block"):
        yield ("parameters of", index), "linear"  # one layer wherever it is called from
    if kind in ("block", "act"):
        yield point + ("tanh",), "tanh"  # a parameter-free op: one per calling statement


def expected_labels(program: Program) -> list[str]:
    """Every pass label of the program's history in execution order, input and output included."""
    ops = ops_run(program)
    layer_of: dict[Hashable, int] = {}  # program point -> layer number (input is layer 0)
    for point, _ in ops:
        layer_of.setdefault(point, len(layer_of) + 1)
    num_passes: dict[Hashable, int] = {}
    for point, _ in ops:
        num_passes[point] = num_passes.get(point, 0) + 1
    labels, type_counts = {}, {"input": 1}
    for point, layer_type in ops:
        if point not in labels:
            type_counts[layer_type] = type_counts.get(layer_type, 0) + 1
            labels[point] = layer_label(layer_type, type_counts[layer_type], layer_of[point])
    seen: dict[Hashable, int] = {}
    out = ["input_1_0"]
    for point, _ in ops:
        seen[point] = seen.get(point, 0) + 1
        out.append(pass_label(labels[point], seen[point], num_passes[point]))
    return out + [layer_label("output", 1, len(layer_of) + 1)]
