"""Choosing the sequence dimension of a site's values across steps, and joining them."""
from __future__ import annotations

import pytest
import torch

from torchlog.errors import InvalidOptionError
from torchlog.generation.stacking import join_steps, sequence_dim


def test_the_dimension_sized_by_each_steps_input_tokens_is_the_sequence() -> None:
    # batch 1: dims 0 and 1 are both 1 at decoding steps, only the prefill tells them apart
    assert sequence_dim([(1, 5, 8), (1, 1, 8), (1, 1, 8)], [5, 1, 1], "h") == 1
    assert sequence_dim([(2, 4, 5, 8), (2, 4, 1, 8)], [5, 1], "q") == 2


def test_without_token_counts_the_one_differing_dimension_is_used() -> None:
    assert sequence_dim([(3, 7), (3, 8), (3, 9)], [None, None, None], "cache") == 1


@pytest.mark.parametrize("shapes, lengths, match", [
    ([(1, 1, 8), (1, 1, 8)], [1, 1], r"cannot tell.*\(1, 1, 8\).*dim="),
    ([(1, 5, 8), (1, 8)], [5, 1], "different numbers of dimensions"),
    ([(1, 2, 5, 5), (1, 2, 1, 6)], [None, None], "cannot tell"),
])
def test_ambiguous_or_unjoinable_shapes_ask_for_dim(shapes, lengths, match) -> None:
    with pytest.raises(InvalidOptionError, match=match):
        sequence_dim(shapes, lengths, "site")


def test_join_concatenates_in_step_order() -> None:
    values = [torch.arange(6.).reshape(1, 3, 2), torch.tensor([[[9., 9.]]])]
    joined = join_steps(values, 1, "h")
    assert torch.equal(joined, torch.cat(values, dim=1))
    assert torch.equal(join_steps(values, -2, "h"), joined)


def test_join_refuses_shapes_differing_elsewhere_and_a_dim_out_of_range() -> None:
    weights = [torch.zeros(1, 2, 5, 5), torch.zeros(1, 2, 1, 6)]
    with pytest.raises(InvalidOptionError, match=r"'w'.*along dim 2.*\(1, 2, 5, 5\), \(1, 2, 1, 6\)"):
        join_steps(weights, 2, "w")
    with pytest.raises(InvalidOptionError, match="dim=4 is out of range"):
        join_steps(weights, 4, "w")
