"""log_generation on a tiny GPT-2: the tokens of plain `generate`, and per-step activations,
logits and tokens equal to a hand-written decode loop read by forward hooks."""
from __future__ import annotations

import pytest
import torch

import torchlog
from torchlog.errors import InvalidOptionError, LayerNotFoundError, StepNotFoundError

from .decoding import SITE, block_output, hand_decode, tiny_gpt2

pytestmark = pytest.mark.heavy
TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def gpt2():
    return tiny_gpt2()


@pytest.fixture(scope="module")
def greedy(gpt2):
    model, prompt = gpt2
    return torchlog.log_generation(model, prompt, max_new_tokens=5, do_sample=False)


def test_greedy_tokens_equal_plain_generate_and_the_model_is_left_as_it_was(gpt2) -> None:
    model, prompt = gpt2
    config_before = model.generation_config.to_dict()
    plain = model.generate(prompt, max_new_tokens=5, do_sample=False)
    gen = torchlog.log_generation(model, prompt, max_new_tokens=5, do_sample=False)
    assert torch.equal(gen.sequences, plain)
    assert torch.equal(gen.tokens, plain[:, prompt.shape[1]:])
    assert gen.num_steps == 5 and len(gen.steps) == 5
    assert "forward" not in vars(model)
    assert model.generation_config.to_dict() == config_before
    assert not model.training


def test_sampling_with_a_seed_draws_the_same_tokens_and_leaves_the_rng_where_plain_does(gpt2) -> None:
    model, prompt = gpt2
    torch.manual_seed(123)
    plain = model.generate(prompt, max_new_tokens=6, do_sample=True, top_k=0)
    state_after_plain = torch.random.get_rng_state()
    torch.manual_seed(123)
    gen = torchlog.log_generation(model, prompt, max_new_tokens=6, do_sample=True, top_k=0)
    assert torch.equal(gen.sequences, plain)
    assert torch.equal(torch.random.get_rng_state(), state_after_plain)


def test_eos_ends_the_generation_and_the_steps_with_it(gpt2) -> None:
    model, prompt = gpt2
    greedy_tokens = model.generate(prompt, max_new_tokens=6, do_sample=False)[0, prompt.shape[1]:]
    eos = int(greedy_tokens[2])
    first = int((greedy_tokens == eos).nonzero()[0])  # the first time EOS is produced
    plain = model.generate(prompt, max_new_tokens=6, do_sample=False, eos_token_id=eos)
    gen = torchlog.log_generation(model, prompt, max_new_tokens=6, do_sample=False, eos_token_id=eos)
    assert torch.equal(gen.sequences, plain)
    assert gen.num_steps == first + 1
    assert int(gen.token(gen.num_steps - 1)) == eos


def test_each_step_equals_the_hand_written_decode_loop(gpt2, greedy) -> None:
    model, prompt = gpt2
    oracle = hand_decode(model, prompt, 5)
    assert torch.equal(greedy.sequences, oracle.sequence)
    for k in range(5):
        assert torch.equal(greedy.input_ids(k), oracle.inputs[k])
        torch.testing.assert_close(greedy.logits(k), oracle.logits[k], **TOL)
        assert torch.equal(greedy.token(k), oracle.tokens[k])
        torch.testing.assert_close(greedy[k, SITE].tensor_contents, oracle.activations[k], **TOL)
        assert greedy.steps[k] is greedy[k]


def test_decoding_steps_share_their_labels_and_read_the_kv_cache_as_inputs(greedy) -> None:
    decoding = [greedy.steps[k].layer_labels for k in range(1, 5)]
    assert all(labels == decoding[0] for labels in decoding)
    # The prefill reads no cache; each decoding step k reads the cache's keys and values,
    # two per block, holding the 6 + k - 1 positions before it.
    def cache_lengths(step: int) -> list[int]:
        history = greedy.steps[step]
        return [history[label].tensor_contents.shape[-2] for label in history.input_layers
                if history[label].tensor_contents.is_floating_point()]
    assert cache_lengths(0) == []
    for k in range(1, 5):
        assert cache_lengths(k) == [6 + k - 1] * 4


def test_stack_joins_a_block_across_steps_into_a_forward_over_the_sequence(gpt2, greedy) -> None:
    model, _ = gpt2
    seen = []
    handle = model.get_submodule(SITE).register_forward_hook(lambda m, a, o: seen.append(block_output(o)))
    try:
        with torch.no_grad():
            model(greedy.sequences[:, :-1])  # no cache: every position in one forward
    finally:
        handle.remove()
    stacked = greedy.stack(SITE)
    assert stacked.shape == seen[0].shape == (1, 6 + 4, 32)
    torch.testing.assert_close(stacked, seen[0], **TOL)
    torch.testing.assert_close(greedy.stack(SITE, steps=[1, 2]), seen[0][:, 6:8], **TOL)


def test_stack_refuses_values_that_cannot_join_and_sites_at_no_step(greedy) -> None:
    # The attention weights grow in two dimensions (queries and keys): no single one to join.
    weights = "softmax_1"
    with pytest.raises(InvalidOptionError, match=r"softmax_1.*\(1, 2, 6, 6\)"):
        greedy.stack(weights)
    with pytest.raises(LayerNotFoundError, match="'transformer.h.9' is at no step"):
        greedy.stack("transformer.h.9")
    with pytest.raises(StepNotFoundError, match=r"step 7 is out of range.*valid: -5\.\.4"):
        greedy.stack(SITE, steps=[0, 7])
    decoding_only = greedy.steps[1].layer_labels[2]  # a cache input: the prefill has none
    with pytest.raises(LayerNotFoundError, match=rf"not at step 0 \(it is at steps \[1, 2, 3, 4\]"):
        greedy.stack(decoding_only)


def test_steps_out_of_range_and_bad_keys_name_the_value(greedy) -> None:
    with pytest.raises(StepNotFoundError, match=r"step 5 is out of range.*-5..4"):
        greedy.steps[5]
    with pytest.raises(StepNotFoundError, match="step -6"):
        greedy[-6, SITE]
    with pytest.raises(LayerNotFoundError, match="transformer.h.7"):
        greedy[1, "transformer.h.7"]
    with pytest.raises(torchlog.InvalidArgumentTypeError, match="'1'"):
        greedy.logits("1")


def test_print_summarises_the_steps_and_to_pandas_has_a_step_column(greedy) -> None:
    text = str(greedy)
    assert text.startswith("GenerationHistory of GPT2LMHeadModel: 5 steps, prompt (1, 6)")
    rows = text.splitlines()[2:7]
    for k, row in enumerate(rows):
        fields = row.split()
        assert fields[0] == str(k) and fields[2] == str(int(greedy.token(k)))
        assert fields[3] == str(len(greedy.steps[k]))
    assert repr(greedy) == "<GenerationHistory of GPT2LMHeadModel: 5 steps>"
    pandas = pytest.importorskip("pandas")
    table = greedy.to_pandas()
    assert isinstance(table, pandas.DataFrame) and table.columns[0] == "step"
    assert table["step"].value_counts().sort_index().tolist() == [len(s) for s in greedy.steps]


def test_a_user_decode_loop_is_logged_one_step_per_call(gpt2) -> None:
    model, prompt = gpt2

    def loop(model, ids):
        return hand_decode(model, ids, 4).sequence

    plain = loop(model, prompt)
    gen = torchlog.log_generation(model, prompt, decode=loop, layers_to_save=[SITE])
    assert torch.equal(gen.sequences, plain) and gen.num_steps == 4
    assert gen.steps[2].layer_labels == [gen.steps[2][SITE].label]
    assert "forward" not in vars(model)
