"""Bad input to log_generation: clear errors naming the value, and the model left as it was,
also when generation raises mid-way (the steps done are kept on the error)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlog
from torchlog.errors import (GenerationError, InvalidArgumentTypeError, InvalidOptionError, LogFileNotFoundError,
                             StepNotFoundError)
from torchlog.interventions import add


class Toy(nn.Module):
    """Next-token logits from an embedding and a linear head; no `generate`."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.head = nn.Embedding(10, 8), nn.Linear(8, 10)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids))


def greedy(model: nn.Module, ids: torch.Tensor, num_steps: int = 3) -> torch.Tensor:
    for _ in range(num_steps):
        ids = torch.cat([ids, model(ids)[:, -1:].argmax(-1)], dim=-1)
    return ids


PROMPT = torch.tensor([[1, 2, 3]])


def test_a_decode_loop_gives_its_own_tokens_one_step_per_call() -> None:
    model = Toy()
    gen = torchlog.log_generation(model, PROMPT, decode=greedy)
    assert torch.equal(gen.sequences, greedy(model, PROMPT))
    assert gen.num_steps == 3
    assert [gen.input_ids(k).shape[-1] for k in range(3)] == [3, 4, 5]  # no cache: the whole sequence
    for k in range(3):
        torch.testing.assert_close(gen.logits(k), model(gen.input_ids(k))[:, -1])


def test_a_model_without_generate_and_no_decode_loop_is_refused_by_name() -> None:
    with pytest.raises(InvalidArgumentTypeError, match="Toy has no generate method.*decode="):
        torchlog.log_generation(Toy(), PROMPT)


@pytest.mark.parametrize("keywords, error, match", [
    ({"decode": "greedy"}, InvalidArgumentTypeError, "decode must be a function.*'greedy'"),
    ({"decode": greedy, "max_new_tokens": 3}, InvalidArgumentTypeError, r"\['max_new_tokens'\]"),
    ({"decode": greedy, "intervene_steps": [-1]}, InvalidArgumentTypeError, "holds -1"),
    ({"decode": greedy, "intervene_steps": ["1"]}, InvalidArgumentTypeError, "holds '1'"),
    ({"decode": greedy, "intervene_steps": "12"}, InvalidArgumentTypeError, "got '12'"),
    ({"decode": greedy, "stop_after": "head"}, InvalidOptionError, "stop_after='head'"),
    ({"decode": greedy, "on_error": "return"}, InvalidOptionError, "on_error='return'"),
    ({"decode": greedy, "save_to": "no_such_folder/gen"}, LogFileNotFoundError, "'no_such_folder/gen'.*does not exist"),
    ({"decode": greedy, "intervene": {"head": add(torch.zeros(10))},
      "options": torchlog.LogOptions(intervene={"emb": add(torch.zeros(8))})}, InvalidOptionError, "give it once"),
    ({"decode": greedy, "options": {"layers_to_save": "all"}}, InvalidArgumentTypeError, "LogOptions"),
], ids=["decode", "generate-keyword", "negative-step", "str-step", "str-steps", "stop", "on-error",
        "save-to", "intervene-twice", "options"])
def test_bad_arguments_are_refused_before_the_model_runs(keywords, error, match) -> None:
    model = Toy()
    calls = []
    model.register_forward_pre_hook(lambda m, a: calls.append(1))
    with pytest.raises(error, match=match):
        torchlog.log_generation(model, PROMPT, **keywords)
    assert not calls and "forward" not in vars(model)


@pytest.mark.parametrize("ids", [torch.rand(1, 3), torch.tensor([1, 2, 3]), [[1, 2]]], ids=["float", "1d", "list"])
def test_input_ids_must_be_a_batch_of_token_ids(ids) -> None:
    with pytest.raises(InvalidArgumentTypeError, match="input_ids must be a .batch, length. tensor"):
        torchlog.log_generation(Toy(), ids, decode=greedy)


def test_a_step_generation_never_reached_is_an_error_carrying_the_generation() -> None:
    with pytest.raises(StepNotFoundError, match=r"step\(s\) \[3, 5\].*ended after 3 steps") as caught:
        torchlog.log_generation(Toy(), PROMPT, decode=greedy, intervene={"head": add(torch.zeros(10))},
                                intervene_steps=[1, 3, 5])
    generation = caught.value.torchlog_generation
    assert generation.num_steps == 3 and [i.step for i in generation.interventions] == [1]


def test_a_decode_loop_that_raises_keeps_the_steps_done_and_restores_the_model() -> None:
    model = Toy()
    own_forward = model.forward
    model.forward = own_forward  # an instance attribute of the user's: it must survive

    def failing(model, ids):
        ids = greedy(model, ids, 2)
        raise KeyError("stop here")

    with pytest.raises(KeyError, match="stop here") as caught:
        torchlog.log_generation(model, PROMPT, decode=failing)
    assert caught.value.torchlog_generation.num_steps == 2
    assert caught.value.torchlog_generation.is_partial
    assert any("2 steps done" in note for note in caught.value.__notes__)
    assert vars(model)["forward"] is own_forward


def test_a_model_that_raises_at_a_step_raises_its_own_error_with_both_histories() -> None:
    class Breaks(Toy):
        def forward(self, ids):
            if ids.shape[-1] == 5:
                raise ValueError(f"bad length {ids.shape[-1]}")
            return super().forward(ids)

    model = Breaks()
    with pytest.raises(ValueError, match="bad length 5") as caught:
        torchlog.log_generation(model, PROMPT, decode=greedy)
    assert caught.value.torchlog_generation.num_steps == 2
    assert caught.value.torchlog_history.is_partial  # the failing step's own partial history
    assert "forward" not in vars(model)


def test_a_decode_loop_returning_no_sequences_is_named() -> None:
    with pytest.raises(GenerationError, match="returned list") as caught:
        torchlog.log_generation(Toy(), PROMPT, decode=lambda m, ids: [greedy(m, ids)])
    assert caught.value.torchlog_generation.num_steps == 3


class InPlaceCache:
    """A cache a forward writes into in place, as a static KV cache does."""

    def __init__(self) -> None:
        self.total = torch.zeros(1, 8)


class WithCache(Toy):
    def forward(self, ids: torch.Tensor, cache: InPlaceCache) -> torch.Tensor:
        hidden = self.emb(ids)
        cache.total.add_(hidden.sum(1))
        return self.head(hidden + cache.total[:, None])


def _cached_greedy(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    cache = InPlaceCache()
    for _ in range(3):
        ids = torch.cat([ids, model(ids[:, -1:], cache=cache)[:, -1:].argmax(-1)], dim=-1)
    return ids


def test_a_cache_written_in_place_is_logged_when_a_step_runs_once() -> None:
    model = WithCache()
    gen = torchlog.log_generation(model, PROMPT, decode=_cached_greedy, intervene={"head": add(torch.ones(10))})
    steered = model.head.register_forward_hook(lambda m, a, out: out + torch.ones(10))
    try:
        assert torch.equal(gen.sequences, _cached_greedy(model, PROMPT))
    finally:
        steered.remove()


def test_a_cache_written_in_place_is_refused_when_a_step_must_run_twice() -> None:
    # A position from the end is found on a probe first: the step would run twice.
    with pytest.raises(GenerationError, match=r"wrote into a tensor of shape \(1, 8\)"):
        torchlog.log_generation(WithCache(), PROMPT, decode=_cached_greedy, intervene={-2: add(torch.ones(10))})


@pytest.mark.heavy
def test_generate_refusing_an_argument_leaves_the_model_and_its_config_as_they_were() -> None:
    from .decoding import tiny_gpt2

    model, prompt = tiny_gpt2()
    config = model.generation_config.to_dict()
    with pytest.raises(ValueError, match="not_a_generate_argument"):
        torchlog.log_generation(model, prompt, max_new_tokens=2, not_a_generate_argument=1)
    with pytest.raises(StepNotFoundError, match="step 4.*max_new_tokens=3"):
        torchlog.log_generation(model, prompt, max_new_tokens=3, intervene_steps=[1, 4],
                                intervene={"transformer.h.0": add(torch.zeros(32))})
    assert "forward" not in vars(model) and model.generation_config.to_dict() == config
