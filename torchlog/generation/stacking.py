"""Joining one site's values across decoding steps along the sequence dimension."""
from __future__ import annotations

import torch

from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError

__all__ = ["beam_path", "sequence_dim", "join_steps"]


def sequence_dim(shapes: list[tuple[int, ...]], lengths: list[int | None], site: str) -> int:
    """The dimension along which values of these shapes grow with the steps.

    It is the one dimension whose size is each step's number of input tokens (the prompt's
    length at the prefill, 1 at each decoding step with a KV cache); failing that, the one
    dimension in which the shapes differ.

    Raises:
        InvalidOptionError: the values have different numbers of dimensions, or no single
            dimension qualifies; the message shows the shapes and asks for `dim=`.
    """
    ranks = {len(shape) for shape in shapes}
    if len(ranks) != 1:
        raise InvalidOptionError(
            f"{site!r} has values of different numbers of dimensions across the steps "
            f"({_shown(shapes)}), so they cannot be joined; read each step with gen[step, {site!r}]")
    rank = ranks.pop()
    if None not in lengths:
        token_dims = [d for d in range(rank) if all(s[d] == n for s, n in zip(shapes, lengths))]
        if len(token_dims) == 1:
            return token_dims[0]
    differing = [d for d in range(rank) if len({s[d] for s in shapes}) > 1]
    if len(differing) == 1:
        return differing[0]
    raise InvalidOptionError(
        f"cannot tell along which dimension {site!r} grows with the steps (shapes "
        f"{_shown(shapes)}, input tokens per step {lengths}); pass dim= to gen.stack")


def join_steps(values: list[torch.Tensor], dim: int, site: str) -> torch.Tensor:
    """`values` (one per step, in order) concatenated along `dim`.

    Raises:
        InvalidOptionError: `dim` is out of range, or the shapes differ in another dimension.
    """
    shapes = [tuple(v.shape) for v in values]
    rank = len(shapes[0])
    if not -rank <= dim < rank:
        raise InvalidOptionError(f"dim={dim!r} is out of range for {site!r}'s values of shape {shapes[0]}")
    dim %= rank
    for shape in shapes:
        if len(shape) != rank or shape[:dim] + shape[dim + 1:] != shapes[0][:dim] + shapes[0][dim + 1:]:
            raise InvalidOptionError(
                f"{site!r}'s values cannot be joined along dim {dim}: their shapes "
                f"{_shown(shapes)} differ in another dimension; read each step with "
                f"gen[step, {site!r}], or pass another dim=")
    return torch.cat([v.to(values[0].device) for v in values], dim=dim)


def beam_path(output: object, sequence: object, num_beams: int, num_steps: int) -> list[int]:
    """The row of each step's batch that returned sequence `sequence` went through: the beam
    whose logits at step k chose its k-th generated token (generate's `beam_indices`), up to
    its end (-1 after an EOS) or the last step.

    Raises:
        InvalidOptionError: no beam search, or generate was not asked for `beam_indices`.
        InvalidArgumentTypeError: `sequence` is not an index of the returned sequences.
    """
    if num_beams <= 1:
        raise InvalidOptionError("follow() traces a hypothesis of a beam search (num_beams > 1); without "
                                 "beams each row continues itself: use gen.stack(site)")
    indices = getattr(output, "beam_indices", None)
    if not isinstance(indices, torch.Tensor):
        raise InvalidOptionError(
            "follow() needs which beam each returned token came from: generate with "
            "return_dict_in_generate=True, output_scores=True (its beam_indices)")
    count = int(indices.shape[0])
    if not isinstance(sequence, int) or isinstance(sequence, bool) or not 0 <= sequence < count:
        raise InvalidArgumentTypeError(
            f"follow takes a returned sequence's index, 0..{count - 1} for this generation's {count} "
            f"sequence(s), got {sequence!r}")
    rows = [int(row) for row in indices[sequence, :num_steps].tolist()]
    return rows[:rows.index(-1)] if -1 in rows else rows


def _shown(shapes: list[tuple[int, ...]]) -> str:
    distinct = list(dict.fromkeys(shapes))
    return ", ".join(str(s) for s in distinct[:4]) + (", ..." if len(distinct) > 4 else "")
