"""Gradients saved per pass: compared with torch.autograd.grad on a plain run of the same model."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import torchlog
from tests.invariants import ancestors
from tests.models import TINY_MODELS, SimpleRecurrent
from tests.torchlog.test_real_models import TORCH_CASES, TRANSFORMERS
from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError, TorchlogWarning
from torchlog.capture.nesting import find_tensors
from torchlog.seeding import seeded


def _weights_like(t: torch.Tensor, k: int) -> torch.Tensor:
    """Fixed random weights, so the loss gives every element its own gradient."""
    generator = torch.Generator().manual_seed(100 + k)
    return torch.randn(t.shape, generator=generator, dtype=t.dtype)


def _loss(outputs: list[torch.Tensor]) -> torch.Tensor:
    return sum((t * _weights_like(t, k)).sum() for k, t in enumerate(outputs)
               if t.is_floating_point() and t.requires_grad)


def _saved_outputs(history: torchlog.ModelHistory) -> list[torch.Tensor]:
    return [history[label].tensor_contents for label in history.output_layers]


def _recurrent_plain_run(model: SimpleRecurrent, x: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """SimpleRecurrent's forward written out, keeping every intermediate by (type, pass)."""
    kept = {}
    for step in range(1, 5):
        kept["linear", step] = lin = model.fc(x)
        kept["add", step] = added = lin + 1
        kept["mul", step] = x = added * 2
    return kept, x


def _by_type_and_pass(history: torchlog.ModelHistory) -> dict:
    return {(p.layer_type, p.pass_num): p for p in history if not (p.is_input or p.is_output)}


def test_every_pass_of_a_recurrent_layer_gets_its_own_gradient() -> None:
    torch.manual_seed(0)
    model, x = SimpleRecurrent(), torch.rand(6, 5)
    history = torchlog.log_forward_pass(model, x, save_gradients=True)
    history.log_backward(_loss(_saved_outputs(history)))

    kept, out = _recurrent_plain_run(model, x)
    expected = torch.autograd.grad(_loss([out]), list(kept.values()))
    records = _by_type_and_pass(history)
    assert records.keys() == kept.keys()
    for key, grad in zip(kept, expected):
        torch.testing.assert_close(records[key].grad_contents, grad, msg=f"gradient of {key}")
    linear = history.layer("linear_1_1")
    assert linear.num_passes == 4
    assert all(p.label in history.layers_with_grads for p in linear.passes)
    firsts = [p.grad_contents for p in linear.passes]
    assert not any(torch.equal(a, b) for a, b in zip(firsts, firsts[1:]))


def test_plain_backward_on_the_saved_output_fills_gradients() -> None:
    """`loss.backward()` by the user, without log_backward, reaches the same hooks."""
    torch.manual_seed(0)
    model, x = SimpleRecurrent(), torch.rand(3, 5)
    history = torchlog.log_forward_pass(model, x, save_gradients=True)
    assert history.layers_with_grads == []
    _loss(_saved_outputs(history)).backward()
    kept, out = _recurrent_plain_run(model, x)
    expected = dict(zip(kept, torch.autograd.grad(_loss([out]), list(kept.values()))))
    for key, record in _by_type_and_pass(history).items():
        torch.testing.assert_close(record.grad_contents, expected[key])


def test_backward_from_an_intermediate_layer() -> None:
    torch.manual_seed(0)
    model, x = SimpleRecurrent(), torch.rand(6, 5)
    history = torchlog.log_forward_pass(model, x.requires_grad_(), save_gradients=True)
    start = _by_type_and_pass(history)["linear", 2]
    history.log_backward(_loss([start.tensor_contents]))

    upstream = ancestors(history, [start.label])
    assert set(history.layers_with_grads) == upstream
    kept, _ = _recurrent_plain_run(model, x)
    keys = [k for k in kept if k[1] == 1] + [("linear", 2)]
    expected = torch.autograd.grad(_loss([kept["linear", 2]]), [x] + [kept[k] for k in keys])
    records = _by_type_and_pass(history)
    torch.testing.assert_close(history[history.input_layers[0]].grad_contents, expected[0])
    for key, grad in zip(keys, expected[1:]):
        torch.testing.assert_close(records[key].grad_contents, grad)


# ----- oracle: module outputs of a plain run, via forward hooks ---------------------------------
def _plain_module_grads(model: nn.Module, args: tuple, seed: int) -> dict[tuple[str, int], list]:
    """(output value, gradient of the loss) per tensor each module call returned.

    Keyed by (address, call number). Outputs changed in place after the module returned
    are left out: autograd.grad would give the gradient of their later version.
    """
    outputs: dict[tuple[str, int], list] = {}
    calls: dict[str, int] = {}

    def hook(address: str):
        def keep(module, inputs, output):
            calls[address] = calls.get(address, 0) + 1
            outputs[address, calls[address]] = [
                (t, t._version) for t, _ in find_tensors(output) if t.requires_grad]
        return keep

    handles = [m.register_forward_hook(hook(a)) for a, m in model.named_modules() if a]
    try:
        with seeded(seed):
            result = model(*args)
    finally:
        for handle in handles:
            handle.remove()
    kept = [(key, t) for key, ts in outputs.items() for t, version in ts if t._version == version]
    grads = torch.autograd.grad(_loss([t for t, _ in find_tensors(result)]), [t for _, t in kept],
                                allow_unused=True)  # None: that output does not reach the loss
    by_call: dict[tuple[str, int], list] = {}
    for (key, t), grad in zip(kept, grads):
        by_call.setdefault(key, []).append((t.detach(), grad))
    return by_call


def _pass_holding(history: torchlog.ModelHistory, labels: tuple[str, ...], value: torch.Tensor):
    """The pass among `labels` whose saved activation equals `value` (a module's output)."""
    for label in labels:
        saved = history[label].tensor_contents
        if saved.shape == value.shape and torch.equal(saved.detach(), value):
            return history[label]
    raise AssertionError(f"no pass among {labels} holds the module output of shape {tuple(value.shape)}")


def _check_module_grads(model: nn.Module, args: tuple, seed: int) -> None:
    expected = _plain_module_grads(model, args, seed)
    assert any(expected.values()), "the oracle found module outputs to compare"
    history = torchlog.log_forward_pass(model, list(args), save_gradients=True, random_seed=seed)
    history.log_backward(_loss(_saved_outputs(history)))
    for (address, call), pairs in expected.items():
        labels = history.modules[address].call_outputs[call - 1]
        for value, grad in pairs:
            record = _pass_holding(history, labels, value)
            if grad is None:
                assert record.grad_contents is None, f"{record.label} does not reach the loss"
            else:
                torch.testing.assert_close(record.grad_contents, grad,
                                           msg=f"gradient at {address}:{call}")


GRAD_MODELS = ["simple_recurrent", "branching", "buffers", "identity", "reused", "nested",
               "multi_output", "conditional",
               "train_eval"]


@pytest.mark.parametrize("name", GRAD_MODELS)
def test_gradients_equal_autograd_on_module_outputs(name: str) -> None:
    make_model, make_input = TINY_MODELS[name]
    torch.manual_seed(0)
    _check_module_grads(make_model(), (make_input(),), seed=9)


@pytest.mark.parametrize("name", sorted(TORCH_CASES))
def test_torch_nn_models_gradients(name: str) -> None:
    """LSTM, GRU (called twice), TransformerEncoder and attention in training mode (dropout)."""
    make_model, make_args = TORCH_CASES[name]
    torch.manual_seed(0)
    _check_module_grads(make_model().train(), make_args(), seed=3)


class _Logits(nn.Module):
    """A causal LM returning only its logits, without a KV cache."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


@pytest.mark.heavy
@pytest.mark.parametrize("name", ["gpt2", "llama", "mixtral"])
def test_transformers_gradients(name: str) -> None:
    torch.manual_seed(0)
    model, kwargs = TRANSFORMERS[name]()
    _check_module_grads(_Logits(model.train()), (kwargs["input_ids"],), seed=3)


# ----- when no gradient can exist --------------------------------------------------------------
def test_no_grad_context_warns() -> None:
    with torch.no_grad(), pytest.warns(TorchlogWarning, match=r"torch.no_grad\(\)") as caught:
        history = torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5), save_gradients=True)
    assert history.layers_with_grads == []
    assert caught[0].filename == __file__, "the warning points at the caller's line"


def test_nothing_requires_grad_warns() -> None:
    model = SimpleRecurrent().requires_grad_(False)
    with pytest.warns(TorchlogWarning, match="no parameter or input of the model requires grad"):
        torchlog.log_forward_pass(model, torch.rand(2, 5), save_gradients=True)


def test_no_warning_when_gradients_can_flow() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5), save_gradients=True)


def test_detached_saved_tensors_are_rejected() -> None:
    with pytest.raises(InvalidOptionError, match="detach_saved_tensors=False"):
        torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5), save_gradients=True,
                                  detach_saved_tensors=True)


def test_save_gradients_must_be_a_bool() -> None:
    with pytest.raises(InvalidArgumentTypeError, match="save_gradients"):
        torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5), save_gradients="yes")


def test_log_backward_needs_save_gradients() -> None:
    history = torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5))
    loss = _loss(_saved_outputs(history))
    with pytest.raises(InvalidOptionError, match="save_gradients=True"):
        history.log_backward(loss)


def test_log_backward_rejects_a_loss_outside_the_graph() -> None:
    history = torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5), save_gradients=True)
    with pytest.raises(InvalidArgumentTypeError, match="does not require grad"):
        history.log_backward(torch.tensor(1.0))


def test_ordinary_logging_registers_no_hooks() -> None:
    """Without save_gradients, backward through the saved output leaves grad_contents empty."""
    history = torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5))
    _loss(_saved_outputs(history)).backward()
    assert history.layers_with_grads == []


def test_layers_to_save_keeps_gradients_of_the_saved_passes() -> None:
    torch.manual_seed(0)
    model, x = SimpleRecurrent(), torch.rand(2, 5)
    output = torchlog.log_forward_pass(model, x).output_layers[0]
    full = torchlog.log_forward_pass(model, x, save_gradients=True, random_seed=1)
    full.log_backward(_loss(_saved_outputs(full)))
    part = torchlog.log_forward_pass(model, x, layers_to_save=["fc", output], save_gradients=True,
                                     random_seed=1)
    part.log_backward(_loss(_saved_outputs(part)))
    assert part.layers_with_grads == part.layer_labels  # every pass kept is reached
    for label in part.layer_labels:
        torch.testing.assert_close(part[label].grad_contents, full[label].grad_contents)
