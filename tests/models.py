"""Tiny CPU models covering the hard cases of capture, shared by every test file."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn


class AlexNet(nn.Module):
    """torchvision's AlexNet architecture, written out (torchvision cannot be installed here)."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(64, 192, kernel_size=5, padding=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(192, 384, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(p=0.5), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(inplace=True),
            nn.Dropout(p=0.5), nn.Linear(4096, 4096), nn.ReLU(inplace=True),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


class SimpleRecurrent(nn.Module):
    """The seed's recurrent model: one Linear applied four times with +1 and *2."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features=5, out_features=5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(4):
            x = self.fc(x)
            x = x + 1
            x = x * 2
        return x


class Branching(nn.Module):
    """Two branches from one tensor that merge again."""

    def __init__(self) -> None:
        super().__init__()
        self.left = nn.Linear(4, 4)
        self.right = nn.Linear(4, 4)

    def forward(self, x):
        a = torch.relu(self.left(x))
        b = torch.sigmoid(self.right(x))
        return torch.cat([a, b], dim=1) - x.repeat(1, 2)


class InPlace(nn.Module):
    """In-place ops next to out-of-place ones, including += and relu_."""

    def forward(self, x):
        y = x * 2
        y.relu_()
        y += 1
        z = torch.sin(y)
        y.mul_(3)
        return y + z


class GetSetItem(nn.Module):
    """Indexing, slice assignment and mutation of a slice after it was read."""

    def forward(self, x):
        y = x.clone()
        first = y[0]
        y[1] = first * 10
        row = y[:, 0]
        row.add_(5)
        return y.sum(dim=1) + first.sum()


class CreatedInside(nn.Module):
    """Tensors made inside forward: factories, from_numpy and the legacy constructor."""

    def forward(self, x):
        z = torch.zeros_like(x) + torch.ones(x.shape) + torch.arange(x.shape[-1])
        n = torch.from_numpy(np.ones(x.shape[-1], dtype=np.float32))
        legacy = torch.Tensor([1.0] * x.shape[-1])
        t = torch.tensor(2.0)
        r = torch.randn(x.shape)
        return x * t + z + n + legacy + x.new_zeros(x.shape) + 0 * r


class WithBuffers(nn.Module):
    """A buffer read in forward and a buffer reassigned during forward."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.full((4,), 3.0))
        self.register_buffer("calls", torch.zeros(()))
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        self.calls = self.calls + 1
        return self.lin(x) * self.scale + self.calls


class IdentityModules(nn.Module):
    """nn.Identity, a module returning its input unchanged, and a same-device .to()."""

    class PassThrough(nn.Module):
        def forward(self, x):
            return x

    def __init__(self) -> None:
        super().__init__()
        self.ident = nn.Identity()
        self.through = self.PassThrough()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        x = self.ident(x)
        x = self.lin(x)
        x = self.through(x)
        return x.to(x.device).contiguous()


class ReusedModule(nn.Module):
    """One module called three times on a chain, and one applied to two inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(4, 4)
        self.act = nn.Tanh()

    def forward(self, x):
        for _ in range(3):
            x = self.act(self.cell(x))
        return x


class Nested(nn.Module):
    """Modules nested three deep."""

    class Inner(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return torch.relu(self.lin(x))

    class Middle(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Nested.Inner()
            self.norm = nn.LayerNorm(4)

        def forward(self, x):
            return self.norm(self.inner(x) + x)

    def __init__(self) -> None:
        super().__init__()
        self.block1 = Nested.Middle()
        self.block2 = Nested.Middle()
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.block2(self.block1(x)))


class StructuredIO(nn.Module):
    """Dict, list and nested inputs; a dict holding a list and a tuple as output."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, batch: dict, extras: list):
        a = self.lin(batch["a"])
        b = batch["nested"][0] * extras[1]
        return {"sum": a + b, "parts": [a, (b, extras[0])]}


class DoubleUse(nn.Module):
    """`x + x`: one parent passed twice."""

    def forward(self, x):
        y = x + x
        return y * y


class Conditional(nn.Module):
    """Control flow on a tensor's value."""

    def __init__(self) -> None:
        super().__init__()
        self.pos = nn.Linear(3, 3)
        self.neg = nn.Linear(3, 3)

    def forward(self, x):
        if x.sum() > 0:
            return self.pos(x)
        return self.neg(x)


class Orphans(nn.Module):
    """A computation that feeds nothing the output depends on."""

    def forward(self, x):
        unused = torch.ones(3) * 5
        unused.exp()
        side = x.cos()
        side.sum()
        return x + 1


class TrainEval(nn.Module):
    """Dropout and batch norm, whose behaviour depends on train/eval."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(4)
        self.drop = nn.Dropout(0.5)
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(self.drop(self.bn(x)))


class MultiOutput(nn.Module):
    """Ops with several outputs: split, max(dim=...), topk, and an LSTM."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 3, batch_first=True)

    def forward(self, x):
        a, b = torch.split(x, 2, dim=-1)
        values, indices = x.max(dim=-1)
        top = torch.topk(x, 2).values
        out, (h, c) = self.lstm(x.unsqueeze(0))
        return a * b, values + indices, top, out.sum() + h.sum() + c.sum()


class NoGradInside(nn.Module):
    """torch.no_grad() inside forward, integer/bool tensors and a 0-d tensor."""

    def forward(self, x):
        with torch.no_grad():
            m = x.abs().max()
        mask = x > 0
        idx = torch.argmax(x, dim=-1)
        return x / m + mask.float() + idx.unsqueeze(-1)


class LongChain(nn.Module):
    """About 2,000 ops: 25 blocks of 27 small Linear layers in a chain, with a skip per block."""

    def __init__(self, num_blocks: int = 25, width: int = 27) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.ModuleList(nn.Linear(2, 2) for _ in range(width)) for _ in range(num_blocks))

    def forward(self, x):
        for block in self.blocks:
            skip = x
            for lin in block:
                x = torch.relu(lin(x)) * 0.5
            x = x + skip
        return x


TINY_MODELS = {
    "simple_recurrent": (SimpleRecurrent, lambda: torch.rand(6, 5)),
    "branching": (Branching, lambda: torch.rand(2, 4)),
    "inplace": (InPlace, lambda: torch.randn(3, 4)),
    "getsetitem": (GetSetItem, lambda: torch.randn(3, 4)),
    "created_inside": (CreatedInside, lambda: torch.randn(2, 4)),
    "buffers": (WithBuffers, lambda: torch.randn(2, 4)),
    "identity": (IdentityModules, lambda: torch.randn(2, 3)),
    "reused": (ReusedModule, lambda: torch.randn(2, 4)),
    "nested": (Nested, lambda: torch.randn(2, 4)),
    "double_use": (DoubleUse, lambda: torch.randn(2, 3)),
    "conditional": (Conditional, lambda: torch.randn(2, 3)),
    "orphans": (Orphans, lambda: torch.randn(3)),
    "train_eval": (TrainEval, lambda: torch.randn(5, 4)),
    "multi_output": (MultiOutput, lambda: torch.randn(5, 4)),
    "no_grad_inside": (NoGradInside, lambda: torch.randn(3, 4)),
}


class ModuleOutputs(nn.Module):
    """Submodules whose outputs are hard to attribute: out of computation order, a parameter,
    one tensor twice, a dict, an input mutated in place, and an output mutated after return."""

    class Reversed(nn.Module):
        def forward(self, x):
            first = x + 1
            second = x * 2
            return second, first

    class WithParameter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.linspace(0.5, 1.5, 3))

        def forward(self, x):
            return x * self.weight, self.weight

    class Twice(nn.Module):
        def forward(self, x):
            y = x.exp()
            return y, y

    class AsDict(nn.Module):
        def forward(self, x):
            a = x.cos()
            return {"b": x.sin(), "a": a}

    class MutatesInput(nn.Module):
        def forward(self, x):
            x.mul_(2)
            return x

    def __init__(self) -> None:
        super().__init__()
        self.reversed = self.Reversed()
        self.param = self.WithParameter()
        self.twice = self.Twice()
        self.as_dict = self.AsDict()
        self.mutates = self.MutatesInput()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        second, first = self.reversed(x)
        scaled, weight = self.param(first)
        e1, e2 = self.twice(second)
        parts = self.as_dict(scaled)
        h = self.lin(x)
        h.relu_()  # changes lin's output after lin returned it
        m = self.mutates(h.clone())
        return m + e1 - e2 + parts["a"] * parts["b"] + weight


class MetadataCalls(nn.Module):
    """Reads shape, size, dim, numel, dtype, device and len: none of them is an op."""

    def forward(self, x):
        n, d = x.shape
        assert x.dim() == 2 and x.size(0) == n and x.size()[1] == d and len(x) == n
        assert x.numel() == n * d and x.dtype == torch.float32 and x.device.type == "cpu"
        return x.reshape(n * d) * x.ndim


class MutatedThroughView(nn.Module):
    """A submodule returns a tensor it changed only through a view of it."""

    class Scatter(nn.Module):
        def forward(self, x):
            y = x.clone()
            y.view(-1)[2:5].mul_(10)
            return y

    def __init__(self) -> None:
        super().__init__()
        self.scatter = self.Scatter()

    def forward(self, x):
        return self.scatter(x) + 1


class LongLoop(nn.Module):
    """One Linear stepped `steps` times with tanh and +1: three ops and a module call a step."""

    def __init__(self, steps: int = 600) -> None:
        super().__init__()
        self.steps = steps
        self.cell = nn.Linear(4, 4)

    def forward(self, x):
        for _ in range(self.steps):
            x = torch.tanh(self.cell(x)) + 1
        return x


class Func(nn.Module):
    """A model whose forward is one function of its input."""

    def __init__(self, func: Callable) -> None:
        super().__init__()
        self.func = func

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.func(x)


class WritesData(nn.Module):
    """Writes a state tensor's `.data` in forward, then reads it (`t.data = v` is an op)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.state = nn.Parameter(torch.zeros(4), requires_grad=False)

    def forward(self, x):
        h = self.fc(x)
        self.state.data = h.mean(0)
        return h + self.state


class SmallCNN(nn.Module):
    """A classic conv net: features (conv, batch norm, relu, pool, conv, relu), then a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                      nn.MaxPool2d(2), nn.Conv2d(4, 6, 3), nn.ReLU())
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(6 * 2 * 2, 5), nn.Tanh(), nn.Linear(5, 3))

    def forward(self, x):
        return self.classifier(self.features(x))
