"""Histories the exporter tests share: tiny models, a crashed one, GPT-2; each checked by the
shared invariant checker before any exporter reads it."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import torchlog
from tests.invariants import check_history
from tests.models import Nested, SimpleRecurrent
from torchlog.history import ModelHistory

__all__ = ["FailsInside", "logged", "nested", "recurrent", "partial", "gpt2"]


class FailsInside(nn.Module):
    """Raises in its second Linear (shape mismatch): gives a partial history."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 3)
        self.second = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x)))


def logged(model: nn.Module, x: Any, **options: Any) -> ModelHistory:
    """Log `model` with seed 0 and check the history's invariants."""
    torch.manual_seed(0)
    history = torchlog.log_forward_pass(model, x, random_seed=0, **options)
    check_history(history)
    return history


def nested(**options: Any) -> ModelHistory:
    """Nested: block1/block2 (inner.lin, norm) and head; 11 passes."""
    torch.manual_seed(0)
    return logged(Nested(), torch.randn(2, 4), **options)


def recurrent(**options: Any) -> ModelHistory:
    """SimpleRecurrent: fc applied 4 times with +1 and *2; 14 passes, 5 layers."""
    torch.manual_seed(0)
    return logged(SimpleRecurrent(), torch.randn(1, 5), **options)


def partial() -> ModelHistory:
    """The history FailsInside leaves on its exception: input, first, relu, then the raise."""
    torch.manual_seed(0)
    with pytest.raises(RuntimeError) as caught:
        torchlog.log_forward_pass(FailsInside(), torch.randn(2, 4), random_seed=0)
    history = caught.value.torchlog_history
    check_history(history)
    return history


def gpt2() -> tuple[ModelHistory, nn.Module, torch.Tensor]:
    """A 2-layer GPT-2 (transformers), its history, the model and the token ids."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100,
                                     n_positions=32, bos_token_id=99, eos_token_id=99)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 100, (1, 8))
    return logged(model, ids), model, ids
