"""The benchmark models: ResNet-50, small MLP/RNN models written by hand, GPT-2 and LLaMA builders.

torchvision cannot be installed here, so ResNet-50 follows its architecture (bottleneck
blocks of 3, 4, 6 and 3, stride on the 3x3 convolution) without importing it. A case is
"op-bound" when its ops are small enough that the logger's cost per op, not the ops'
arithmetic, sets the log time (issue 16's list: SimpleRecurrent, the 50-block MLP, a
stepped RNN cell, GPT-2, a tiny LLaMA). The probes are not models to compare: they
isolate the fixed cost of one `log_forward_pass` call and the cost of one module call.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


class Bottleneck(nn.Module):
    """1x1 -> 3x3 -> 1x1 convolutions with a shortcut, widening the channels 4x."""

    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int = 1) -> None:
        super().__init__()
        out_channels = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """A bottleneck ResNet; `ResNet((3, 4, 6, 3))` is ResNet-50 (25.6M parameters)."""

    def __init__(self, blocks_per_stage: tuple[int, ...] = (3, 4, 6, 3), num_classes: int = 1000,
                 base_width: int = 64) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, base_width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(base_width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        channels = base_width
        stages = []
        for i, num_blocks in enumerate(blocks_per_stage):
            width = base_width * 2 ** i
            stride = 1 if i == 0 else 2
            blocks = []
            for b in range(num_blocks):
                blocks.append(Bottleneck(channels, width, stride if b == 0 else 1))
                channels = width * Bottleneck.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = (stages + [nn.Identity()] * 4)[:4]
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def resnet50(num_classes: int = 1000) -> ResNet:
    """ResNet-50 in eval mode with random weights (no downloads).

    Example:
        >>> sum(p.numel() for p in resnet50().parameters())
        25557032
    """
    return ResNet((3, 4, 6, 3), num_classes).eval()


class SimpleRecurrent(nn.Module):
    """The seed's recurrent model (the TorchLens article): one Linear four times with +1 and *2, 12 ops."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features=5, out_features=5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(4):
            x = self.fc(x)
            x = x + 1
            x = x * 2
        return x


class SteppedCell(nn.Module):
    """An nn.GRUCell stepped by a Python loop over the time axis, then a Linear head."""

    def __init__(self, input_size: int = 32, hidden_size: int = 64, num_classes: int = 10) -> None:
        super().__init__()
        self.cell = nn.GRUCell(input_size, hidden_size)
        self.head = nn.Linear(hidden_size, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.new_zeros(x.shape[0], self.cell.hidden_size)
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
        return self.head(h)


class AddOne(nn.Module):
    """One op in one module: the unit of the module-call probe."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


class ModuleChain(nn.Module):
    """`length` calls of an AddOne module: `length` ops and `length` module calls."""

    def __init__(self, length: int = 100) -> None:
        super().__init__()
        self.steps = nn.ModuleList(AddOne() for _ in range(length))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for step in self.steps:
            x = step(x)
        return x


class IdleModules(nn.Module):
    """One op, and `count` AddOne submodules that forward never calls: against IdleModules(0),
    what each submodule costs a call just by being there (the module walk, its table entry,
    its forward wrapper put on and taken off)."""

    def __init__(self, count: int = 200) -> None:
        super().__init__()
        self.idle = nn.ModuleList(AddOne() for _ in range(count))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


class InlineChain(nn.Module):
    """The same `length` additions as ModuleChain with no submodule: its baseline."""

    def __init__(self, length: int = 100) -> None:
        super().__init__()
        self.length = length

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.length):
            x = x + 1
        return x


class DeepMLP(nn.Module):
    """`depth` blocks of Linear -> LayerNorm -> GELU; 3 ops per block plus the head."""

    def __init__(self, depth: int = 50, width: int = 256, num_classes: int = 10) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width), nn.GELU()) for _ in range(depth)
        )
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class ElmanRNN(nn.Module):
    """A hand-written RNN over the time axis: the same two Linears run once per step."""

    def __init__(self, input_size: int = 64, hidden_size: int = 128, num_classes: int = 10) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.input_proj = nn.Linear(input_size, hidden_size)
        self.recurrent = nn.Linear(hidden_size, hidden_size, bias=False)
        self.head = nn.Linear(hidden_size, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.new_zeros(x.shape[0], self.hidden_size)
        for t in range(x.shape[1]):
            h = torch.tanh(self.input_proj(x[:, t]) + self.recurrent(h))
        return self.head(h)


def gpt2_small(num_layers: int = 6, hidden: int = 256, num_heads: int = 4,
               vocab_size: int = 1000, max_positions: int = 256) -> nn.Module:
    """A GPT2LMHeadModel from a GPT2Config with random weights, in eval mode (no downloads).

    The vocabulary is small (1000, not 50257) so that the language-model head does not
    dominate the plain forward time and hide the cost per op of the transformer blocks.

    Raises:
        ImportError: transformers is not installed.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=num_layers, n_embd=hidden, n_head=num_heads, vocab_size=vocab_size,
                        n_positions=max_positions, bos_token_id=vocab_size - 1,
                        eos_token_id=vocab_size - 1)
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).eval()


def tiny_llama(num_layers: int = 2, hidden: int = 128, num_heads: int = 4, vocab_size: int = 1000,
               max_positions: int = 256) -> nn.Module:
    """A LlamaForCausalLM from a small LlamaConfig with random weights, in eval mode (no downloads).

    Raises:
        ImportError: transformers is not installed.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(num_hidden_layers=num_layers, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_attention_heads=num_heads, num_key_value_heads=num_heads // 2,
                         vocab_size=vocab_size, max_position_embeddings=max_positions,
                         bos_token_id=0, eos_token_id=1, pad_token_id=2)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


@dataclass(frozen=True)
class BenchCase:
    """A model to benchmark and how to make its input."""

    name: str
    build: Callable[[], nn.Module]
    make_input: Callable[[], Any]  # returns the `input_args` for log_forward_pass
    repeats: int  # timed runs per measurement (the median is reported)
    is_op_bound: bool = False  # in issue 16's list of models whose cost is per op, not arithmetic


def _tokens(batch: int, length: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(0))


def _seed_input() -> torch.Tensor:
    return torch.rand(6, 5, generator=torch.Generator().manual_seed(0))  # the article's 6x5 input


def full_cases() -> list[BenchCase]:
    """The models of the full benchmark: the op-bound ones first, then the others."""
    return [
        BenchCase("SimpleRecurrent (seed)", lambda: SimpleRecurrent().eval(), _seed_input, 41, True),
        BenchCase("MLP (50 blocks)", lambda: DeepMLP(50).eval(), lambda: torch.randn(32, 256), 21, True),
        BenchCase("GRUCell (16 steps)", lambda: SteppedCell().eval(), lambda: torch.randn(8, 16, 32), 21, True),
        BenchCase("GPT-2 (6 layers)", gpt2_small, lambda: _tokens(1, 128, 1000), 11, True),
        BenchCase("LLaMA (2 layers)", tiny_llama, lambda: _tokens(1, 128, 1000), 11, True),
        BenchCase("RNN (64 steps)", lambda: ElmanRNN().eval(), lambda: torch.randn(16, 64, 64), 21),
        BenchCase("ResNet-50 224x224", resnet50, lambda: torch.randn(1, 3, 224, 224), 7),
    ]


def probe_cases(quick: bool = False) -> dict[str, BenchCase]:
    """The probes by role: 'linear' and 'seed' (fixed cost per call), 'modules' and 'inline',
    'idle' and 'bare'.

    The fixed cost of one call is its log time minus its plain time on a model of a few
    ops; the cost of one module call is the extra overhead of ModuleChain over
    InlineChain (the same ops, without the modules) divided by the number of calls; the
    cost of one uncalled submodule, that of IdleModules(200) over IdleModules(0) divided by 200.
    """
    repeats = 3 if quick else 21
    return {
        "linear": BenchCase("Linear(8, 8) on (2, 8)", lambda: nn.Linear(8, 8).eval(),
                            lambda: torch.randn(2, 8), repeats),
        "seed": BenchCase("SimpleRecurrent (12 ops)", lambda: SimpleRecurrent().eval(), _seed_input, repeats),
        "modules": BenchCase("100 AddOne module calls", ModuleChain, lambda: torch.randn(2, 8), repeats),
        "inline": BenchCase("100 inline additions", InlineChain, lambda: torch.randn(2, 8), repeats),
        "idle": BenchCase("1 op, 200 uncalled submodules", lambda: IdleModules(200), lambda: torch.randn(2, 8), repeats),
        "bare": BenchCase("1 op, no submodule", lambda: IdleModules(0), lambda: torch.randn(2, 8), repeats),
    }


def quick_cases() -> list[BenchCase]:
    """Small models for a smoke run of a few seconds."""
    return [
        BenchCase("SimpleRecurrent (seed)", lambda: SimpleRecurrent().eval(), _seed_input, 3, True),
        BenchCase("MLP (10 blocks)", lambda: DeepMLP(10, 64).eval(), lambda: torch.randn(8, 64), 3),
        BenchCase("RNN (8 steps)", lambda: ElmanRNN(16, 32).eval(), lambda: torch.randn(4, 8, 16), 3),
        BenchCase("ResNet (1 block/stage) 64x64", lambda: ResNet((1, 1, 1, 1), 10, 16).eval(),
                  lambda: torch.randn(1, 3, 64, 64), 3),
    ]
