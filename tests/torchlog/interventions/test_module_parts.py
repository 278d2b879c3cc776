"""Which tensor a module site acts on: one output of several (select.module(..., output=k)) or
what the module receives (select.module_input), each against a plain forward hook or
forward pre-hook doing the same edit, through every executor that runs the model."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlog
from torchlog import select
from torchlog.errors import InterventionError
from torchlog.interventions import add, patch_from, scale, zero_ablate
from torchlog.replay import replay


class ReadsTheState(nn.Module):
    """Reads an LSTM's final state h_n, not its output sequence."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 4, batch_first=True)

    def forward(self, x):
        _, (h, _) = self.lstm(x)
        return h[-1] * 2


class Pair(nn.Module):
    def forward(self, x):
        return 2 * x, 3 * x


class UsesBoth(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pair = Pair()

    def forward(self, x):
        a, b = self.pair(x)
        return a + 10 * b


def _hooked(model, module, edit, x):
    handle = module.register_forward_hook(lambda m, args, out: edit(out))
    try:
        with torch.no_grad():
            return model(x)
    finally:
        handle.remove()


def test_the_lstm_state_is_acted_on_when_named_and_equals_a_hook() -> None:
    torch.manual_seed(0)
    model, x = ReadsTheState(), torch.randn(2, 5, 3)
    want = _hooked(model, model.lstm, lambda out: (out[0], (torch.zeros_like(out[1][0]), out[1][1])), x)
    history = torchlog.log_forward_pass(model, x, intervene={select.module("lstm", output=1): zero_ablate()})
    torch.testing.assert_close(history[-1].tensor_contents, want, rtol=0, atol=0)
    (record,) = history.interventions
    assert record.part == "output 1 of 3" and "output 1 of 3" in str(record)
    result = torchlog.run(model, x, intervene={select.module("lstm", output=1): zero_ablate()})
    torch.testing.assert_close(result.output, want, rtol=0, atol=0)
    assert result.interventions[0].part == "output 1 of 3"


def test_a_module_site_without_output_acts_on_output_0_and_says_so() -> None:
    torch.manual_seed(0)
    model, x = ReadsTheState(), torch.randn(2, 5, 3)
    history = torchlog.log_forward_pass(model, x, intervene={"lstm": zero_ablate()})
    (record,) = history.interventions
    assert record.part == "output 0 of 3"
    plain = torchlog.log_forward_pass(model, x)
    torch.testing.assert_close(history[-1].tensor_contents, plain[-1].tensor_contents)  # h_n unchanged


@pytest.mark.parametrize("output, edit", [(0, lambda out: (torch.zeros_like(out[0]), out[1])),
                                          (1, lambda out: (out[0], torch.zeros_like(out[1])))])
def test_each_output_of_a_pair_equals_a_hook_in_every_executor(output, edit) -> None:
    model, x = UsesBoth(), torch.arange(3.0)
    want = _hooked(model, model.pair, edit, x)
    site = {select.module("pair", output=output): zero_ablate()}
    assert torch.equal(torchlog.log_forward_pass(model, x, intervene=site)[-1].tensor_contents, want)
    assert torch.equal(torchlog.run(model, x, intervene=site).output, want)
    logged = torchlog.log_forward_pass(model, x, save_function_args=True)
    assert torch.equal(replay(logged, site)[-1].tensor_contents, want)


def test_an_output_the_module_does_not_return_is_refused_naming_the_count() -> None:
    model, x = UsesBoth(), torch.arange(3.0)
    with pytest.raises(InterventionError, match=r"names output 2 of pair:1, which returned 2 tensor"):
        torchlog.log_forward_pass(model, x, intervene={select.module("pair", output=2): zero_ablate()})
    with pytest.raises(InterventionError, match=r"names output 2 of pair:1, which returned 2 tensor"):
        torchlog.run(model, x, intervene={select.module("pair", output=2): zero_ablate()})


class Box:
    """A container torchlog cannot rebuild."""

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value


class Boxed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(2, 2)

    def forward(self, x):
        return Box(self.inner(x))


class ReadsTheBox(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.boxed = Boxed()

    def forward(self, x):
        return self.boxed(x).value * 2


def test_a_change_that_cannot_reach_the_return_value_is_an_error_not_a_firing() -> None:
    with pytest.raises(InterventionError, match=r"boxed:1 returned a Box with no tensor torchlog can find"):
        torchlog.log_forward_pass(ReadsTheBox(), torch.ones(1, 2), intervene={"boxed": zero_ablate()})
    with pytest.raises(InterventionError, match=r"boxed:1 returned a Box with no tensor torchlog can find"):
        torchlog.run(ReadsTheBox(), torch.ones(1, 2), intervene={"boxed": zero_ablate()})


# ----- module inputs -------------------------------------------------------------------------
class Residual(nn.Module):
    """The outer residual reads x, the block gets x: an input edit must reach only the block."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 4), nn.Tanh())

    def forward(self, x):
        return x + self.block(x)


def _pre_hooked(model, module, edit, x):
    handle = module.register_forward_pre_hook(lambda m, args: (edit(args[0]),) + tuple(args[1:]))
    try:
        with torch.no_grad():
            return model(x)
    finally:
        handle.remove()


def test_a_module_input_equals_a_forward_pre_hook_and_leaves_other_readers_alone() -> None:
    torch.manual_seed(0)
    model, x = Residual(), torch.randn(3, 4)
    vector = torch.linspace(-1, 1, 4)
    want = _pre_hooked(model, model.block, lambda v: v + vector, x)
    site = {select.module_input("block"): add(vector)}
    history = torchlog.log_forward_pass(model, x, intervene=site)
    torch.testing.assert_close(history[-1].tensor_contents, want, rtol=1e-6, atol=1e-6)
    (record,) = history.interventions
    assert record.label == "input_1_0" and record.part == "input 0 of 1"
    assert torch.equal(history["input_1_0"].tensor_contents, x)  # the value itself is unchanged
    torch.testing.assert_close(torchlog.run(model, x, intervene=site).output, want, rtol=1e-6, atol=1e-6)


def test_a_module_input_site_is_refused_where_it_cannot_act() -> None:
    class NoArgs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(2))

        def forward(self):
            return self.weight * 2

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.source = NoArgs()

        def forward(self, x):
            return x + self.source()

    calls = []
    model = Outer()
    model.register_forward_pre_hook(lambda m, a: calls.append(1))
    with pytest.raises(InterventionError, match=r"whose forward takes no argument"):
        torchlog.log_forward_pass(model, torch.ones(2), intervene={select.module_input("source"): zero_ablate()})
    assert calls == []  # refused before the model ran
    with pytest.raises(InterventionError, match=r"names input 1 of block:1, which received 1 tensor"):
        torchlog.log_forward_pass(Residual(), torch.ones(1, 4), intervene={select.module_input("block", index=1): scale(2.0)})
    logged = torchlog.log_forward_pass(Residual(), torch.ones(1, 4), save_function_args=True)
    with pytest.raises(InterventionError, match=r"replay cannot recompute"):
        replay(logged, {select.module_input("block"): scale(2.0)})
    with pytest.raises(torchlog.InvalidOptionError, match=r"intervention site, not a pass"):
        torchlog.log_forward_pass(Residual(), torch.ones(1, 4), layers_to_save=[select.module_input("block")])
    with pytest.raises(InterventionError, match=r"not a pass a sweep can patch"):
        torchlog.patching.sweep(Residual(), torch.ones(1, 4), torch.zeros(1, 4), [select.module_input("block")],
                                lambda out: out.sum())


def test_a_gpt2_block_input_equals_a_pre_hook_on_the_block() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
                                     bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    model, ids = transformers.GPT2LMHeadModel(config).eval(), torch.randint(0, 100, (1, 8))
    vector = torch.linspace(-1, 1, 32)
    want = _pre_hooked(model, model.transformer.h[1], lambda v: v + vector, ids).logits
    site = {select.module_input("transformer.h.1"): add(vector)}
    history = torchlog.log_forward_pass(model, ids, intervene=site)
    torch.testing.assert_close(history[-1].tensor_contents, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torchlog.run(model, ids, intervene=site).output.logits, want, rtol=1e-5, atol=1e-5)


class PairThenBlock(nn.Module):
    """A module returning two tensors, then a block reading their sum: every kind of module site."""

    def __init__(self) -> None:
        super().__init__()
        self.pair, self.block = Pair(), nn.Linear(3, 3)

    def forward(self, x):
        a, b = self.pair(x)
        return self.block(a + 10 * b) + x


def test_patch_from_copies_the_same_output_or_input_of_the_other_run() -> None:
    """patch_from at output 1 copies the other run's output 1 (not output 0), and at a module
    input the value the module received there: each against a hook doing the same."""
    torch.manual_seed(0)
    model, clean, corrupted = PairThenBlock(), torch.ones(1, 3), torch.full((1, 3), 5.0)
    source = torchlog.log_forward_pass(model, clean)
    want = _hooked(model, model.pair, lambda out: (out[0], 3 * clean), corrupted)
    got = torchlog.log_forward_pass(model, corrupted, intervene={select.module("pair", output=1): patch_from(source)})
    assert torch.equal(got[-1].tensor_contents, want)
    want = _pre_hooked(model, model.block, lambda v: 2 * clean + 30 * clean, corrupted)
    got = torchlog.log_forward_pass(model, corrupted, intervene={select.module_input("block"): patch_from(source)})
    torch.testing.assert_close(got[-1].tensor_contents, want)


class ReturnsItsWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        return self.fc.weight, self.fc(x)


class ReadsBoth(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = ReturnsItsWeight()

    def forward(self, x):
        weight, y = self.inner(x)
        return y * 2 + weight.sum()


def test_a_returned_parameter_is_not_one_of_the_outputs_a_module_site_numbers() -> None:
    """A module's outputs are numbered without the parameters it returns as they are (they are
    no pass of the call): output 0 is the linear's result in the recorder, the module hooks
    and layers_to_save alike, never the weight."""
    torch.manual_seed(0)
    model, x = ReadsBoth(), torch.ones(1, 3)
    want = _hooked(model, model.inner, lambda out: (out[0], out[1] * 3), x)
    site = {select.module("inner", output=0): scale(3.0)}
    logged = torchlog.log_forward_pass(model, x, intervene=site)
    torch.testing.assert_close(logged[-1].tensor_contents, want)
    assert logged.interventions[0].part == "output 0 of 1"
    torch.testing.assert_close(torchlog.run(model, x, intervene=site).output, want)
    saved = torchlog.log_forward_pass(model, x, layers_to_save=["inner"])
    assert torch.equal(saved[saved.layer_labels[0]].tensor_contents, model.inner.fc(x))
