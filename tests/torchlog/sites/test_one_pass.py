"""The model runs once per call wherever what the call names can be decided while it runs.

Calls are counted with a forward pre-hook on the model (an oracle outside torchlog), on
GPT-2 from a small transformers config and on small models of our own; every result is
also checked against a plain-PyTorch computation, so a single pass that saved or acted on
the wrong op fails here too.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlog
from torchlog import select
from torchlog.errors import InterventionError
from torchlog.interventions import scale, zero_ablate
from torchlog.sites.probes import PROBES

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
                                     bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 100, (1, 8))
    return model, ids


class Counted:
    """Counts the model's calls with a forward pre-hook while it is entered."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.calls = model, 0

    def __enter__(self) -> "Counted":
        self.handle = self.model.register_forward_pre_hook(self._count)
        return self

    def _count(self, module, args) -> None:
        self.calls += 1

    def __exit__(self, *exc) -> None:
        self.handle.remove()


def _calls(model, ids, **keywords):
    PROBES.drop_model(model)
    with Counted(model) as counted:
        history = torchlog.log_forward_pass(model, ids, **keywords)
    return counted.calls, history


def _first(history, func_name):
    return next(p.label for p in history.passes if p.func_name == func_name)


@pytest.mark.heavy
def test_every_row_of_the_table_calls_gpt2_once(gpt2) -> None:
    model, ids = gpt2
    full = torchlog.log_forward_pass(model, ids)
    softmax, dropout = _first(full, "softmax"), _first(full, "dropout")
    rows = {
        "plain": {},
        "a module saved": dict(layers_to_save=["lm_head"]),
        "a module site": dict(intervene={"transformer.h.1": zero_ablate()}),
        "a label site": dict(intervene={softmax: scale(0.5)}),
        "a dropout label site": dict(intervene={dropout: scale(0.5)}),
        "stop after a module": dict(stop_after="transformer.h.0"),
        "stop after a module call": dict(stop_after="transformer.h.0:1"),
        "stop after a label's pass": dict(stop_after=softmax + ":1"),
        "a label saved": dict(layers_to_save=[softmax]),
        "a position saved": dict(layers_to_save=[5]),
        "a selector saved": dict(layers_to_save=[select.func("softmax") & select.in_module("transformer.h.1")]),
        "a substring saved": dict(layers_to_save=["softmax"]),
        "a module output selector site": dict(intervene={select.module("transformer.h.0", output=0): scale(2.0)}),
        "a module input site": dict(intervene={select.module_input("transformer.h.1"): scale(2.0)}),
    }
    for name, keywords in rows.items():
        calls, _ = _calls(model, ids, **keywords)
        assert calls == 1, f"{name}: the model ran {calls} times"


@pytest.mark.heavy
def test_the_one_pass_saves_and_acts_on_what_a_plain_forward_shows(gpt2) -> None:
    model, ids = gpt2
    seen = {}
    handle = model.lm_head.register_forward_hook(lambda m, a, out: seen.setdefault("lm_head", out.detach().clone()))
    with torch.no_grad():
        model(ids)
    handle.remove()
    _, saved = _calls(model, ids, layers_to_save=["lm_head"])
    (label,) = saved.layer_labels
    torch.testing.assert_close(saved[label].tensor_contents, seen["lm_head"], rtol=1e-5, atol=1e-6)
    # A label site in the one pass equals the same edit by a hook on the module whose output it is.
    full = torchlog.log_forward_pass(model, ids)
    block = full["transformer.h.0"].label
    _, acted = _calls(model, ids, intervene={block: zero_ablate()})
    def zero_first(module, args, out):
        if isinstance(out, torch.Tensor):
            return torch.zeros_like(out)
        return (torch.zeros_like(out[0]),) + tuple(out[1:])

    handle = model.transformer.h[0].register_forward_hook(zero_first)
    with torch.no_grad():
        want = model(ids).logits
    handle.remove()
    torch.testing.assert_close(acted[-1].tensor_contents, want, rtol=1e-5, atol=1e-6)
    assert [r.label for r in acted.interventions] == [block]


class Loop(nn.Module):
    """A loop before the op named: labels after it are numbered by layers, not nodes."""

    def __init__(self) -> None:
        super().__init__()
        self.cell, self.head = nn.Linear(3, 3), nn.Linear(3, 2)

    def forward(self, x):
        for _ in range(3):
            x = torch.tanh(self.cell(x))
        return self.head(x)


def test_a_label_after_a_loop_is_resolved_on_a_probe_which_the_next_call_reuses() -> None:
    torch.manual_seed(0)
    model, x = Loop(), torch.rand(2, 3)
    full = torchlog.log_forward_pass(model, x)
    head = full["head"].label
    assert int(head.split("_")[-1]) != full["head"].op_index  # the guess from the label is wrong here
    first, history = _calls(model, x, intervene={head: zero_ablate()})
    assert first >= 2 and [r.label for r in history.interventions] == [head]
    assert torch.equal(history[-1].tensor_contents, torch.zeros(2, 2))
    with Counted(model) as again:
        torchlog.log_forward_pass(model, x, intervene={"tanh_1_2:3": scale(0.0)})
    assert again.calls == 1  # the kept probe resolves it: one pass
    with Counted(model) as repeated:
        torchlog.log_forward_pass(model, x, intervene={head: zero_ablate()})
    assert repeated.calls == 1  # the wrong guess is not made again: the kept probe places the label
    with Counted(model) as other_shape:
        torchlog.log_forward_pass(model, torch.rand(5, 3), intervene={"tanh_1_2:3": scale(0.0)})
    assert other_shape.calls == 2  # another input signature: probed anew


def test_a_kept_probe_the_model_no_longer_matches_is_made_again() -> None:
    class Switch(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.use_sigmoid = nn.Linear(3, 3), False

        def forward(self, x):
            for _ in range(2):
                x = self.fc(x)
            return torch.sigmoid(x) * 2 if self.use_sigmoid else torch.relu(x) * 2

    torch.manual_seed(0)
    model, x = Switch(), torch.rand(1, 3)
    PROBES.drop_model(model)
    torchlog.log_forward_pass(model, x, intervene={"linear_1_1:2": scale(1.0)})  # keeps a probe
    model.use_sigmoid = True  # the same signature, other ops after the site
    history = torchlog.log_forward_pass(model, x, intervene={"mul": zero_ablate()})
    assert [p.func_name for p in history.passes][-3:] == ["sigmoid", "mul", "output"]
    assert torch.equal(history[-1].tensor_contents, torch.zeros(1, 3))


def test_a_label_that_names_nothing_is_refused_in_one_pass() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    with Counted(model) as counted, pytest.raises(InterventionError, match=r"'sigmoid_1_2' matches no pass"):
        torchlog.log_forward_pass(model, torch.ones(1, 2), intervene={"sigmoid_1_2": zero_ablate()})
    assert counted.calls >= 1


def test_stop_after_a_module_address_stops_at_its_first_call_and_runs_nothing_after() -> None:
    ran = []

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cell, self.tail = nn.Linear(2, 2), nn.Linear(2, 2)

        def forward(self, x):
            ran.append("forward")
            x = self.cell(self.cell(x))
            ran.append("tail")
            return self.tail(x)

    history = torchlog.log_forward_pass(Twice(), torch.ones(1, 2), stop_after="cell")
    assert ran == ["forward"] and history.stopped_at == "linear_1_1"
    assert [p.func_name for p in history.passes] == ["input", "linear"]
