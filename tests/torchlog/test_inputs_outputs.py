"""Inputs and outputs of issue 15: tensors inside plain objects, autograd.grad inside forward,
one module under several addresses, one module called twice inside a block."""
from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
from torch import nn

import torchlog


class Wrapper:
    """A plain object holding a tensor as an attribute."""

    def __init__(self, t: torch.Tensor) -> None:
        self.tensor = t


@dataclasses.dataclass
class Holder:
    tensor: torch.Tensor


Named = collections.namedtuple("Named", "tensor")


class TakesObject(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, w: object) -> torch.Tensor:
        return self.fc(w.tensor)


class TakesObjectList(TakesObject):
    def forward(self, ws: list) -> torch.Tensor:
        return self.fc(ws[0].tensor) + self.fc(ws[1].tensor)


def _log(model: nn.Module, args: list) -> torchlog.ModelHistory:
    history = torchlog.log_forward_pass(model, args, random_seed=0)
    torchlog.lint(history)
    return history


@pytest.mark.parametrize(("make", "name"), [(Wrapper, "args[0].tensor"),
                                            (Holder, "args[0]['tensor']"),
                                            (Named, "args[0][0]")])
def test_a_tensor_inside_an_object_is_an_input(make: type, name: str) -> None:
    x = torch.rand(2, 3)
    history = _log(TakesObject(), [make(x)])
    assert history.layer_labels == ["input_1_0", "linear_1_1", "output_1_2"]
    assert history.input_layers == ["input_1_0"]
    assert history[0].buffer_address == name
    assert torch.equal(history[0].tensor_contents, x)


@pytest.mark.parametrize("make", [Wrapper, Holder, Named])
def test_tensors_inside_objects_in_a_list_are_inputs(make: type) -> None:
    a, b = torch.rand(2, 3), torch.rand(2, 3)
    history = _log(TakesObjectList(), [[make(a), make(b)]])
    assert history.layer_labels == ["input_1_0", "input_2_1", "linear_1_2:1", "linear_1_2:2",
                                    "add_1_3", "output_1_4"]
    assert torch.equal(history["input_2_1"].tensor_contents, b)


def test_an_object_reachable_twice_or_holding_itself_is_walked_once() -> None:
    w = Wrapper(torch.rand(2, 3))
    w.me = w
    history = _log(TakesObjectList(), [[w, w]])
    assert history.input_layers == ["input_1_0"]
    assert history.layer_labels == ["input_1_0", "linear_1_1:1", "linear_1_1:2", "add_1_2",
                                    "output_1_3"]


class InnerStep(nn.Module):
    """A MAML-style inner step: torch.autograd.grad inside forward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.requires_grad_()
        loss = self.fc(x).sum()
        (g,) = torch.autograd.grad(loss, x, create_graph=True)
        return x - 0.1 * g


def test_autograd_grad_in_forward_is_an_op_of_what_it_differentiates() -> None:
    torch.manual_seed(0)
    model, x = InnerStep(), torch.rand(2, 3)
    history = _log(model, [x])
    assert history.layer_labels == ["input_1_0", "linear_1_1", "sum_1_2", "grad_1_3", "mul_1_4",
                                    "sub_1_5", "output_1_6"]
    grad = history["grad_1_3"]
    assert grad.kind == "op"
    assert grad.parent_labels == ("sum_1_2", "input_1_0")
    expected = model.fc.weight.detach().expand(2, 3)
    assert torch.allclose(grad.tensor_contents, expected)
    assert history["mul_1_4"].parent_labels == ("grad_1_3",)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cpe(self.fc(x))


class SharedCpe(nn.Module):
    """One module registered under three addresses, as timm's CoaT does."""

    def __init__(self, shared_first: bool) -> None:
        super().__init__()
        if shared_first:
            self.cpe1 = nn.Linear(3, 3)
        self.blocks = nn.ModuleList([Block(), Block()])
        if not shared_first:
            self.cpe1 = nn.Linear(3, 3)
        for block in self.blocks:
            block.cpe = self.cpe1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


@pytest.mark.parametrize(("shared_first", "first", "others"), [
    (True, "cpe1", ("blocks.0.cpe", "blocks.1.cpe")),
    (False, "blocks.0.cpe", ("blocks.1.cpe", "cpe1")),
])
def test_every_address_of_a_shared_module_finds_it(shared_first: bool, first: str,
                                                    others: tuple[str, ...]) -> None:
    history = _log(SharedCpe(shared_first), [torch.rand(2, 3)])
    shared = "linear_2_2"
    assert history.layer_labels == ["input_1_0", "linear_1_1", f"{shared}:1", "linear_3_3",
                                    f"{shared}:2", "output_1_4"]
    record = history.modules[first]
    assert record.aliases == others and record.num_passes == 2
    for address in (first, *others):
        assert history[address].label == shared
        assert history[f"{address}:2"].label == f"{shared}:2"
    assert history.modules["blocks.1"].children == ("blocks.1.fc", first)
    text = str(history)
    assert f"blocks.1.fc, {first} (x2)" in text
    chosen = torchlog.log_forward_pass(SharedCpe(shared_first), torch.rand(2, 3), random_seed=0,
                                       layers_to_save=[others[0]])
    assert chosen.layer_labels == [f"{shared}:1", f"{shared}:2"]


class SelfCycle(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(3, 3))
        self.inner.add_module("back", self)  # a cycle: the model inside its own child

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner[0](x)


def test_a_module_cycle_prints_and_its_children_end() -> None:
    history = _log(SelfCycle(), [torch.rand(2, 3)])
    assert history.modules["inner"].children == ("inner.0",)
    assert "inner.0" in str(history)


class DropPath(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 0.5


class ResidualBlock(nn.Module):
    """One drop_path module applied after attention and after the MLP."""

    def __init__(self, drop: nn.Module) -> None:
        super().__init__()
        self.attn, self.mlp, self.drop_path = nn.Linear(3, 3), nn.Linear(3, 3), drop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.attn(x))
        return x + self.drop_path(self.mlp(x))


@pytest.mark.parametrize(("drop", "outputs"), [
    (DropPath(), (("mul_1_2",), ("mul_2_5",))),
    (nn.Identity(), (("linear_1_1",), ("linear_2_3",))),
])
def test_a_module_called_twice_in_one_block_is_one_module_with_two_passes(
        drop: nn.Module, outputs: tuple) -> None:
    history = _log(nn.Sequential(ResidualBlock(drop)), [torch.rand(2, 3)])
    module = history.modules["0.drop_path"]
    assert module.num_passes == 2 and module.call_outputs == outputs
    assert [m for m in history.modules] == ["0", "0.attn", "0.mlp", "0.drop_path"]
    assert "0.drop_path (x2)" in str(history)
    assert history["0.drop_path:2"].label == outputs[1][0]


class Returns(nn.Module):
    """Returns what `kind` names: one tensor twice, an input unchanged, or constants."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.fc, self.kind = nn.Linear(3, 3), kind
        self.table = torch.arange(3.0)  # a plain attribute: no op makes it

    def forward(self, x: torch.Tensor):
        y = self.fc(x)
        made = torch.ones(2)
        return {
            "tuple": lambda: (y, y),
            "dict": lambda: {"a": y, "b": y},
            "nested": lambda: [y, (x, y), {"c": x}],
            "input": lambda: x,
            "made": lambda: made,
            "made_twice": lambda: (made, y, made),
            "attribute": lambda: (self.table, self.table),
        }[self.kind]()


# What each output must hold, read from the model and its input, in the returned order.
_RETURNED = {
    "tuple": (["linear"] * 2, lambda m, x: [m.fc(x)] * 2),
    "dict": (["linear"] * 2, lambda m, x: [m.fc(x)] * 2),
    "nested": (["linear", "input", "linear", "input"], lambda m, x: [m.fc(x), x, m.fc(x), x]),
    "input": (["input"], lambda m, x: [x]),
    "made": (["ones"], lambda m, x: [torch.ones(2)]),
    "made_twice": (["ones", "linear", "ones"], lambda m, x: [torch.ones(2), m.fc(x), torch.ones(2)]),
    "attribute": (["tensor"] * 2, lambda m, x: [m.table] * 2),
}


@pytest.mark.parametrize("kind", sorted(_RETURNED))
def test_each_returned_tensor_is_one_childless_output_of_its_producer(kind: str) -> None:
    torch.manual_seed(0)
    model, x = Returns(kind), torch.rand(2, 3)
    history = _log(model, [x])  # lint: an output has no children
    producers, values = _RETURNED[kind]
    outputs = [history[label] for label in history.output_layers]
    assert [history[o.parent_labels[0]].func_name for o in outputs] == producers
    assert all(len(o.parent_labels) == 1 and not o.children for o in outputs)
    for output, value in zip(outputs, values(model, x), strict=True):
        assert torch.equal(output.tensor_contents, value.detach())
    assert all(not history[label].is_output for o in outputs for label in o.parent_labels)


@pytest.mark.parametrize("kind", ["tuple", "dict", "made_twice", "attribute"])
def test_a_tensor_returned_twice_saves_selects_and_replays(kind: str) -> None:
    torch.manual_seed(0)
    model, x = Returns(kind), torch.rand(2, 3)
    chosen = torchlog.log_forward_pass(model, x, random_seed=0, layers_to_save=["linear", "output"])
    torchlog.lint(chosen)
    assert len(chosen.output_layers) == len(_RETURNED[kind][0])
    assert torchlog.validate_saved_activations(model, x, random_seed=0)
