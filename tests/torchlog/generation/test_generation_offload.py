"""A model offloaded by accelerate (`cpu_offload`, or `dispatch_model` with 'cpu' and 'disk' in
its device_map: parameters on the meta device until their module runs) generates under
log_generation what the same model generates without offloading, step by step, steered as a
plain forward hook steers it, and is left as it was, also when generation raises."""
from __future__ import annotations

import copy

import pytest
import torch

import torchlog
from torchlog.errors import ModelInputError
from torchlog.interventions import add

from .decoding import SITE, hand_decode, hooked_generate, tiny_gpt2

accelerate = pytest.importorskip("accelerate")  # in the dev extra
pytestmark = pytest.mark.heavy
TOL = dict(rtol=1e-5, atol=1e-5)
DEVICE_MAP = {"transformer.wte": "cpu", "transformer.wpe": "disk", "transformer.drop": "cpu",
              "transformer.h.0": "disk", "transformer.h.1": "cpu", "transformer.ln_f": "disk", "lm_head": "cpu"}


@pytest.fixture(params=["cpu_offload", "dispatch_model"])
def offloaded(request, tmp_path):
    """(offloaded GPT-2, a copy made before offloading, prompt)."""
    model, prompt = tiny_gpt2()
    plain = copy.deepcopy(model)
    if request.param == "cpu_offload":
        accelerate.cpu_offload(model, execution_device=torch.device("cpu"))
    else:
        accelerate.dispatch_model(model, device_map=DEVICE_MAP, offload_dir=str(tmp_path))
    assert model.transformer.h[0].attn.c_attn.weight.is_meta  # loaded at each call only
    return model, plain, prompt


def _kept(model: torch.nn.Module) -> tuple:
    """accelerate's hooks and forwards on every module, and which tensors are on the meta device."""
    modules = list(model.named_modules())
    return ([(a, m.__dict__.get("_hf_hook"), m.__dict__.get("forward")) for a, m in modules],
            sorted(a for a, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta))


def test_each_step_equals_the_hand_written_decode_loop_without_offloading(offloaded) -> None:
    model, plain, prompt = offloaded
    before = _kept(model)
    gen = torchlog.log_generation(model, prompt, max_new_tokens=3, do_sample=False)
    oracle = hand_decode(plain, prompt, 3)
    assert torch.equal(gen.sequences, oracle.sequence)
    assert torch.equal(gen.sequences, plain.generate(prompt, max_new_tokens=3, do_sample=False))
    for k in range(3):
        assert torch.equal(gen.token(k), oracle.tokens[k])
        torch.testing.assert_close(gen.logits(k), oracle.logits[k], **TOL)
        torch.testing.assert_close(gen[k, SITE].tensor_contents, oracle.activations[k], **TOL)
        # Every weight accelerate loaded is read as the parameter it is (lm_head's tied weight,
        # which cpu_offload loads apart, under lm_head's own address).
        used = {p.address for record in gen.steps[k].passes for p in record.params}
        assert used - {"lm_head.weight"} == set(dict(plain.named_parameters()))
    assert _kept(model) == before
    assert torch.equal(model.generate(prompt, max_new_tokens=3, do_sample=False), gen.sequences)


def test_steering_equals_a_forward_hook_on_the_model_without_offloading(offloaded) -> None:
    model, plain, prompt = offloaded
    vector = torch.randn(32, generator=torch.Generator().manual_seed(3)) * 4.0
    oracle = hooked_generate(plain, prompt, "transformer.h.0", lambda call, h: h + vector if call >= 1 else h,
                             max_new_tokens=4, do_sample=False)
    assert not torch.equal(oracle, plain.generate(prompt, max_new_tokens=4, do_sample=False))
    gen = torchlog.log_generation(model, prompt, intervene={"transformer.h.0": add(vector)},
                                  intervene_steps=range(1, 4), max_new_tokens=4, do_sample=False)
    assert torch.equal(gen.sequences, oracle)
    assert [i.step for i in gen.interventions] == [1, 2, 3]


def test_generation_that_raises_leaves_the_model_generating_as_before(offloaded) -> None:
    model, plain, prompt = offloaded
    before = _kept(model)

    def broken(value: torch.Tensor, firing: object) -> torch.Tensor:
        raise ValueError("a broken action")

    # Inside the offloaded c_attn's call: its weights are loaded when the action raises.
    inside = torchlog.select.func("addmm") & torchlog.select.in_module("transformer.h.0.attn.c_attn")
    with pytest.raises(Exception, match="a broken action") as info:
        torchlog.log_generation(model, prompt, intervene={inside: broken}, intervene_steps=[1],
                                max_new_tokens=3, do_sample=False)
    assert info.value.torchlog_generation.num_steps == 1  # the prefill was done
    assert _kept(model) == before
    expected = plain.generate(prompt, max_new_tokens=3, do_sample=False)
    assert torch.equal(model.generate(prompt, max_new_tokens=3, do_sample=False), expected)


def test_a_model_on_the_meta_device_without_offloading_gets_the_materialise_message() -> None:
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(ModelInputError, match=r"'0\.weight' is on the meta device.*to_empty"):
        torchlog.log_forward_pass(model, torch.ones(1, 2))
