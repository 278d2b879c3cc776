"""A model offloaded by accelerate (`cpu_offload`: its parameters sit on the meta device until
their module runs) is refused by name, not logged wrongly, and is left as it was: it still
generates what the same model generates without offloading."""
from __future__ import annotations

import copy

import pytest
import torch

import torchlog
from torchlog.errors import ModelInputError

from .decoding import tiny_gpt2

accelerate = pytest.importorskip("accelerate")  # in the dev extra
pytestmark = pytest.mark.heavy
REFUSED = r"'transformer\.wte\.weight' is offloaded by accelerate .*cannot log yet.*without offloading"


@pytest.fixture(scope="module")
def offloaded():
    model, prompt = tiny_gpt2()
    plain = copy.deepcopy(model)
    accelerate.cpu_offload(model, execution_device=torch.device("cpu"))
    assert model.transformer.wte.weight.is_meta  # what the refusal is about
    return model, plain, prompt


def test_log_forward_pass_refuses_an_offloaded_model_naming_the_parameter(offloaded) -> None:
    model, _, prompt = offloaded
    with pytest.raises(ModelInputError, match=REFUSED):
        torchlog.log_forward_pass(model, prompt)


def test_log_generation_refuses_it_and_leaves_it_generating_as_before(offloaded) -> None:
    model, plain, prompt = offloaded
    hooked_forward = vars(model)["forward"]  # accelerate's own wrapper, an instance attribute
    with pytest.raises(ModelInputError, match=REFUSED) as info:
        torchlog.log_generation(model, prompt, max_new_tokens=3, do_sample=False)
    assert info.value.torchlog_generation.num_steps == 0
    assert vars(model)["forward"] is hooked_forward and model.transformer.wte.weight.is_meta
    expected = plain.generate(prompt, max_new_tokens=3, do_sample=False)
    assert torch.equal(model.generate(prompt, max_new_tokens=3, do_sample=False), expected)


def test_a_model_on_the_meta_device_without_offloading_gets_the_materialise_message() -> None:
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(ModelInputError, match=r"'0\.weight' is on the meta device.*to_empty"):
        torchlog.log_forward_pass(model, torch.ones(1, 2))
