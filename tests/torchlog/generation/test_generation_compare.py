"""`torchlog.compare` between two steps of a generation and between the same step of two
generations: the rows pair by label, and the first divergence is where the steps really part
(the KV cache that grew, the block a vector was added to, the token a step read)."""
from __future__ import annotations

import pytest
import torch

import torchlog
from torchlog.comparison.rows import Status
from torchlog.interventions import add

from .decoding import hooked_generate, tiny_gpt2

pytestmark = pytest.mark.heavy
BLOCK = "transformer.h.1"
STEERED = [2, 3]
STEPS = 5


@pytest.fixture(scope="module")
def runs():
    model, prompt = tiny_gpt2()
    torch.manual_seed(1)
    vector = torch.randn(32) * 4.0  # large enough to change the greedy token
    plain = torchlog.log_generation(model, prompt, max_new_tokens=STEPS, do_sample=False)
    steered = torchlog.log_generation(model, prompt, intervene={BLOCK: add(vector)}, intervene_steps=STEERED,
                                      max_new_tokens=STEPS, do_sample=False)
    # The oracle for the tokens: the same edit by a plain forward hook.
    oracle = hooked_generate(model, prompt, BLOCK, lambda call, h: h + vector if call in STEERED else h,
                             max_new_tokens=STEPS, do_sample=False)
    assert torch.equal(steered.sequences, oracle)
    assert not torch.equal(plain.sequences, oracle), "the vector must change a token for these tests"
    return plain, steered, vector


def test_two_decoding_steps_pair_by_label_and_part_first_at_the_cache_that_grew(runs) -> None:
    plain, _, _ = runs
    one, two = plain.steps[1], plain.steps[2]
    comparison = torchlog.compare(one, two)
    assert comparison.alignment == "label" and all(row.is_paired for row in comparison)
    # A row is a shape row exactly where the two steps' values differ in shape (the cache
    # and everything that reads it: one position more at step 2).
    for row in comparison:
        shapes = tuple(one[row.label_a].tensor_contents.shape), tuple(two[row.label_b].tensor_contents.shape)
        assert (row.status is Status.SHAPE) == (shapes[0] != shapes[1]), row
    first = comparison.first_divergence
    assert first is not None and first.label_a in one.input_layers and first.status is Status.SHAPE
    assert one[first.label_a].tensor_contents.shape[-2] + 1 == two[first.label_a].tensor_contents.shape[-2]


def test_a_steered_and_a_plain_generation_part_first_at_the_steered_block(runs) -> None:
    plain, steered, vector = runs
    step = STEERED[0]
    comparison = torchlog.compare(plain.steps[step], steered.steps[step])
    assert comparison.alignment == "label"
    first = comparison.first_divergence
    block_out = plain[step, BLOCK]
    assert first is not None and first.label_a == block_out.label and first.module == BLOCK
    # The difference there is the vector itself, read from the two values by hand.
    difference = steered[step, BLOCK].tensor_contents - block_out.tensor_contents
    torch.testing.assert_close(difference, vector.expand_as(difference), rtol=1e-5, atol=1e-4)
    assert first.max_abs_diff == pytest.approx(vector.abs().max().item(), rel=1e-4)
    # Every pass before the steered block's output matches.
    assert all(row.status is Status.MATCH for row in comparison.rows[:first.position])


def test_steps_before_the_first_steered_step_do_not_differ(runs) -> None:
    plain, steered, _ = runs
    for step in range(STEERED[0]):
        comparison = torchlog.compare(plain.steps[step], steered.steps[step])
        assert comparison.first_divergence is None
        assert {str(row.status) for row in comparison} == {"match"}, step


def test_after_the_steered_steps_the_first_divergence_is_the_token_read(runs) -> None:
    plain, steered, _ = runs
    step = STEERED[-1] + 1
    assert not torch.equal(plain.input_ids(step), steered.input_ids(step))
    comparison = torchlog.compare(plain.steps[step], steered.steps[step])
    first = comparison.first_divergence
    token_input = plain.steps[step].input_layers[0]
    assert torch.equal(plain.steps[step][token_input].tensor_contents, plain.input_ids(step))
    assert first is not None and first.label_a == token_input
