"""Tests of torchlog/capture/offload.py: a model whose layers accelerate offloads
(`cpu_offload`, `disk_offload`, `dispatch_model` with 'cpu' and 'disk' in its device_map) is
logged op by op as the same model without accelerate, its loaded weights count as parameters,
interventions equal the same edit by a plain forward hook, and the model is left as it was,
also when it or an action raises."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import torchlog
from tests.invariants import record_module_outputs
from tests.torchlog.generation.decoding import block_output, tiny_gpt2
from torchlog.errors import ModelInputError
from torchlog.interventions import add, scale

accelerate = pytest.importorskip("accelerate")  # in the dev extra
pytestmark = pytest.mark.heavy
TOL = dict(rtol=1e-5, atol=1e-6)
CPU = torch.device("cpu")
# Blocks and embeddings left in memory ('cpu') or loaded from files at each call ('disk').
DEVICE_MAP = {"transformer.wte": "cpu", "transformer.wpe": "disk", "transformer.drop": "cpu",
              "transformer.h.0": "disk", "transformer.h.1": "cpu", "transformer.ln_f": "disk", "lm_head": "cpu"}


def _offload(kind: str, model: nn.Module, folder: object) -> None:
    if kind == "cpu_offload":
        accelerate.cpu_offload(model, execution_device=CPU)
    elif kind == "disk_offload":
        accelerate.disk_offload(model, str(folder), execution_device=CPU)
    else:
        accelerate.dispatch_model(model, device_map=DEVICE_MAP, offload_dir=str(folder))


@pytest.fixture(params=["cpu_offload", "disk_offload", "dispatch_model"])
def gpt2(request, tmp_path):
    """(offloaded GPT-2, a copy made before offloading, prompt)."""
    model, prompt = tiny_gpt2()
    plain = copy.deepcopy(model)
    _offload(request.param, model, tmp_path)
    assert model.transformer.h[0].ln_1.weight.is_meta  # offloaded: loaded at each call only
    return model, plain, prompt


class _State:
    """What must be the same after torchlog ran the model: accelerate's hooks and forwards,
    which tensors are on the meta device, and what the model computes."""

    def __init__(self, model: nn.Module) -> None:
        modules = list(model.named_modules())
        self.hooks = {a: m.__dict__.get("_hf_hook") for a, m in modules}
        self.forwards = {a: m.__dict__.get("forward") for a, m in modules}
        self.meta = {a for a, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta}

    def check(self, model: nn.Module, plain: nn.Module, prompt: torch.Tensor) -> None:
        assert _State(model).__dict__ == self.__dict__
        with torch.no_grad():
            torch.testing.assert_close(model(prompt).logits, plain(prompt).logits, **TOL)


def test_each_op_equals_the_model_without_accelerate(gpt2) -> None:
    model, plain, prompt = gpt2
    state = _State(model)
    history = torchlog.log_forward_pass(model, prompt, random_seed=0)
    expected = torchlog.log_forward_pass(plain, prompt, random_seed=0)
    assert history.layer_labels == expected.layer_labels  # accelerate's own copies are no ops
    # GPT-2's lm_head shares wte's weight; cpu_offload and disk_offload load it for each module apart.
    tied = {"lm_head.weight": "transformer.wte.weight"}
    for got, want in zip(history.passes, expected.passes, strict=True):
        assert (got.kind, got.parents, got.containing_modules) == (want.kind, want.parents, want.containing_modules)
        assert [tied.get(p.address, p.address) for p in got.params] == [p.address for p in want.params]
        assert [p.shape for p in got.params] == [p.shape for p in want.params]
        torch.testing.assert_close(got.tensor_contents, want.tensor_contents, **TOL)
    assert history.num_params == expected.num_params
    state.check(model, plain, prompt)


def test_every_module_call_equals_forward_hooks_on_the_model_without_accelerate(gpt2) -> None:
    model, plain, prompt = gpt2
    seen, output = record_module_outputs(plain, (prompt,))
    history = torchlog.log_forward_pass(model, prompt)
    for address, module in history.modules.items():
        calls = seen.get(address, [])  # a container never called (h) has no hook calls
        assert len(module.call_outputs) == len(calls)
        for labels, tensors in zip(module.call_outputs, calls):
            assert len(labels) == len(tensors)
            for label, want in zip(labels, tensors):
                torch.testing.assert_close(history[label].tensor_contents, want, **TOL)
    (logits,) = [history[label].tensor_contents for label in history.output_layers if
                 history[label].tensor_contents.shape == output.logits.shape]
    torch.testing.assert_close(logits, output.logits, **TOL)


def test_saving_chosen_layers_runs_twice_and_keeps_the_weights_offloaded(gpt2) -> None:
    model, plain, prompt = gpt2
    state = _State(model)
    (hidden,), _ = _hooked(plain, prompt, "transformer.h.1")
    history = torchlog.log_forward_pass(model, prompt, layers_to_save=["transformer.h.1"])
    torch.testing.assert_close(history["transformer.h.1"].tensor_contents, hidden, **TOL)
    state.check(model, plain, prompt)


def _hooked(model: nn.Module, prompt: torch.Tensor, address: str, edit: object = None,
            read: str | None = None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """A plain forward of `model`, with `edit(output)` done by a forward hook on `address`;
    returns what `read` (or `address`) output at each call, and the logits."""
    seen: list[torch.Tensor] = []

    def change(module: nn.Module, args: tuple, output: object) -> object:
        if edit is None:
            return None
        hidden = edit(block_output(output))
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    handles = [model.get_submodule(address).register_forward_hook(change),
               model.get_submodule(read or address).register_forward_hook(
                   lambda module, args, output: seen.append(block_output(output).detach().clone()))]
    try:
        with torch.no_grad():
            return seen, model(prompt).logits
    finally:
        for handle in handles:
            handle.remove()


def test_intervening_on_a_module_equals_a_forward_hook_on_the_model_without_accelerate(gpt2) -> None:
    model, plain, prompt = gpt2
    state = _State(model)
    vector = torch.randn(32, generator=torch.Generator().manual_seed(5)) * 3.0
    (after,), logits = _hooked(plain, prompt, "transformer.h.0", lambda h: h + vector, read="transformer.h.1")
    history = torchlog.log_forward_pass(model, prompt, intervene={"transformer.h.0": add(vector)})
    torch.testing.assert_close(history["transformer.h.1"].tensor_contents, after, **TOL)
    run = torchlog.run(model, prompt, intervene={"transformer.h.0": add(vector)})
    torch.testing.assert_close(run.output.logits, logits, **TOL)
    assert len(history.interventions) == 1 and [f.label for f in run.interventions] == ["transformer.h.0:1"]
    state.check(model, plain, prompt)


def test_intervening_on_a_layer_label_equals_a_forward_hook_on_the_model_without_accelerate(gpt2) -> None:
    model, plain, prompt = gpt2
    state = _State(model)
    address = "transformer.h.0.mlp.c_fc"
    (label,) = torchlog.log_forward_pass(plain, prompt).modules[address].call_outputs[0]
    (after,), logits = _hooked(plain, prompt, address, lambda h: h * 2.0, read="transformer.h.1")
    history = torchlog.log_forward_pass(model, prompt, intervene={label: scale(2.0)})
    assert [f.label for f in history.interventions] == [label]
    torch.testing.assert_close(history["transformer.h.1"].tensor_contents, after, **TOL)
    run = torchlog.run(model, prompt, intervene={label: scale(2.0)})  # counted by the lean capture
    assert [f.label for f in run.interventions] == [label]
    torch.testing.assert_close(run.output.logits, logits, **TOL)
    state.check(model, plain, prompt)


def test_an_action_that_raises_leaves_the_model_as_it_was(gpt2) -> None:
    model, plain, prompt = gpt2
    state = _State(model)

    def broken(value: torch.Tensor, firing: object) -> torch.Tensor:
        raise ValueError("a broken action")

    # At a module's exit (its weights back on meta), and inside an offloaded module's call
    # (its weights loaded when the action raises).
    inside = torchlog.select.func("addmm") & torchlog.select.in_module("transformer.h.0.attn.c_attn")
    for site in ("transformer.h.0.attn", inside):
        for run in (torchlog.log_forward_pass, torchlog.run):
            with pytest.raises(Exception, match="a broken action"):
                run(model, prompt, intervene={site: broken})
            state.check(model, plain, prompt)


def test_a_forward_that_raises_or_stops_early_puts_the_loaded_weights_back(gpt2) -> None:
    model, plain, prompt = gpt2
    state = _State(model)
    with pytest.raises(IndexError):  # positions past n_positions: inside wpe's call, which loads its weight
        torchlog.log_forward_pass(model, torch.ones(1, 70, dtype=torch.long))
    state.check(model, plain, prompt)
    history = torchlog.log_forward_pass(model, prompt, stop_after="transformer.h.0.attn")
    assert history.stopped_at is not None
    state.check(model, plain, prompt)


def test_offloaded_buffers_are_logged_as_buffers_and_put_back_after_a_training_pass() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(144, 5))
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
    plain, x = copy.deepcopy(model), torch.randn(2, 3, 8, 8)
    accelerate.cpu_offload(model, execution_device=CPU, offload_buffers=True)
    stored = model[1]._hf_hook.weights_map  # where accelerate keeps the running stats between calls
    before = {name: stored[name].clone() for name in ("running_mean", "running_var", "num_batches_tracked")}
    for training in (False, True):
        model.train(training)
        plain.train(training)
        history = torchlog.log_forward_pass(model, x, random_seed=0)
        expected = torchlog.log_forward_pass(plain, x, random_seed=0)
        assert [(p.label, p.kind, p.buffer_address) for p in history.passes] == [
            (p.label, p.kind, p.buffer_address) for p in expected.passes]
        assert "buffer" in [p.kind for p in history.passes]
        for got, want in zip(history.passes, expected.passes):
            torch.testing.assert_close(got.tensor_contents, want.tensor_contents, **TOL)
        assert all(torch.equal(stored[name], value) for name, value in before.items())
        assert all(b.is_meta for b in model.buffers())


def test_a_meta_parameter_no_hook_loads_is_still_refused_by_name(tmp_path) -> None:
    model, prompt = tiny_gpt2()
    accelerate.dispatch_model(model, device_map=DEVICE_MAP, offload_dir=str(tmp_path))
    with torch.device("meta"):  # on a module kept in memory: nothing will load it
        model.transformer.h[1].ln_2.weight = nn.Parameter(torch.empty(32))
    with pytest.raises(ModelInputError, match=r"'transformer\.h\.1\.ln_2\.weight' is on the meta device.*to_empty"):
        torchlog.log_forward_pass(model, prompt)


def test_torchlog_run_on_a_forward_that_raises_puts_the_loaded_weights_back(gpt2) -> None:
    model, plain, prompt = gpt2
    state = _State(model)
    with pytest.raises(IndexError):  # module hooks alone run this plan: no mode, no log
        torchlog.run(model, torch.ones(1, 70, dtype=torch.long), intervene={"transformer.h.1": scale(2.0)})
    state.check(model, plain, prompt)
