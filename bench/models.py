"""The benchmark models: ResNet-50 and small CNN/MLP/RNN models written by hand, and a GPT-2 builder.

torchvision cannot be installed here, so ResNet-50 follows its architecture (bottleneck
blocks of 3, 4, 6 and 3, stride on the 3x3 convolution) without importing it.
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


@dataclass(frozen=True)
class BenchCase:
    """A model to benchmark and how to make its input."""

    name: str
    build: Callable[[], nn.Module]
    make_input: Callable[[], Any]  # returns the `input_args` for log_forward_pass
    repeats: int  # timed runs per measurement (the median is reported)


def _tokens(batch: int, length: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(0))


def full_cases() -> list[BenchCase]:
    """The models of the full benchmark, smallest first."""
    return [
        BenchCase("MLP (50 blocks)", lambda: DeepMLP(50).eval(), lambda: torch.randn(32, 256), 21),
        BenchCase("RNN (64 steps)", lambda: ElmanRNN().eval(), lambda: torch.randn(16, 64, 64), 21),
        BenchCase("GPT-2 (6 layers)", gpt2_small, lambda: _tokens(1, 128, 1000), 11),
        BenchCase("ResNet-50 224x224", resnet50, lambda: torch.randn(1, 3, 224, 224), 7),
    ]


def quick_cases() -> list[BenchCase]:
    """Small models for a smoke run of a few seconds."""
    return [
        BenchCase("MLP (10 blocks)", lambda: DeepMLP(10, 64).eval(), lambda: torch.randn(8, 64), 3),
        BenchCase("RNN (8 steps)", lambda: ElmanRNN(16, 32).eval(), lambda: torch.randn(4, 8, 16), 3),
        BenchCase("ResNet (1 block/stage) 64x64", lambda: ResNet((1, 1, 1, 1), 10, 16).eval(),
                  lambda: torch.randn(1, 3, 64, 64), 3),
    ]
