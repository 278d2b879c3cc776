"""Writes through `.data` (`b.data = v`, `b.data.add_(1)`): readers depend on the write."""
from __future__ import annotations

import torch
from torch import nn

import torchlog


class DataSetInALoop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("buf", torch.zeros(4))
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        for _ in range(3):
            self.buf.data = self.buf + self.fc(x)
            x = torch.relu(x + self.buf)
        return x


def _expected(model: DataSetInALoop, x: torch.Tensor) -> list[torch.Tensor]:
    """buf after each of the three writes, by plain arithmetic."""
    buf, values = torch.zeros(4), []
    with torch.no_grad():
        for _ in range(3):
            buf = buf + model.fc(x)
            values.append(buf)
            x = torch.relu(x + buf)
    return values


def test_reads_after_a_data_set_depend_on_the_write_and_the_loop_folds() -> None:
    torch.manual_seed(0)
    model, x = DataSetInALoop(), torch.rand(2, 4)
    history = torchlog.log_forward_pass(model, x, random_seed=0)
    torchlog.lint(history)
    writes = [p for p in history if p.func_name == "set_data"]
    assert len(writes) == 3 and len({p.layer_label for p in writes}) == 1
    for write, value in zip(writes, _expected(model, x), strict=True):
        assert torch.allclose(write.tensor_contents, value)  # the value at the time
        readers = [history[c] for c in write.children]
        assert {r.func_name for r in readers} >= {"add"}
    adds = [layer for layer in history.layers if layer.layer_type == "add"]
    relus = [layer for layer in history.layers if layer.layer_type == "relu"]
    assert [len(layer.passes) for layer in adds] == [3, 3] and [len(layer.passes) for layer in relus] == [3]
    assert torch.equal(model.buf, torch.zeros(4))  # put back after the pass


def test_a_data_set_replays() -> None:
    torch.manual_seed(0)
    assert torchlog.validate_saved_activations(DataSetInALoop(), torch.rand(2, 4), random_seed=0)


class _AliasWrites(nn.Module):
    """Writes through the `.data` alias, which has a version counter of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("b", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b + x
        y.data.add_(1)
        z = y * 2
        y.data.copy_(x * 5)
        return z + y


def test_writes_through_a_data_alias_are_seen_by_later_reads() -> None:
    x = torch.arange(3.0)
    history = torchlog.log_forward_pass(_AliasWrites(), x, random_seed=0)
    torchlog.lint(history)
    mul = next(p for p in history if p.func_name == "mul")
    (parent,) = mul.parent_labels
    assert history[parent].func_name == "add_", "z = y * 2 must read y as written by y.data.add_"
    assert torch.equal(history[parent].tensor_contents, x + 1)
    last = next(p for p in reversed(list(history)) if p.func_name == "add")
    written = [history[label] for label in last.parent_labels]
    assert any(p.func_name == "copy_" and torch.equal(p.tensor_contents, x * 5) for p in written)
    assert torch.equal(history[-1].tensor_contents, (x + 1) * 2 + x * 5)
    assert torchlog.validate_saved_activations(_AliasWrites(), x, random_seed=0)
