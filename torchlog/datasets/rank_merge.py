"""Merging the statistics of every rank of a torch.distributed run, exactly and identically on each.

Each rank packs its state (JSON metadata and named tensors) into one byte buffer, the
buffers are all-gathered (padded to the longest: a quantile sketch's size differs between
ranks), and every rank unpacks all of them and merges them into a blank state in rank
order 0, 1, ..., so every rank does the same float operations on the same bits and ends
with identical results. Tensors travel as their raw bytes: nothing is rounded or pickled.
Under NCCL the buffers go to this process's CUDA device for the collectives only.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch

from torchlog.errors import InvalidOptionError
from torchlog.datasets.ranks import Ranks, current_ranks

__all__ = ["merge_rank_states", "pack", "unpack"]

State = tuple[dict[str, Any], dict[str, torch.Tensor]]
_HEADER_BYTES = 8  # the length of the JSON header, little-endian, before it


def pack(state: State) -> torch.Tensor:
    """`state` as one uint8 tensor: header length, JSON header, then each tensor's bytes."""
    meta, tensors = state
    layout = [[name, str(t.dtype).removeprefix("torch."), list(t.shape)] for name, t in tensors.items()]
    header = json.dumps({"meta": meta, "tensors": layout}).encode()
    parts = [torch.tensor(list(len(header).to_bytes(_HEADER_BYTES, "little")), dtype=torch.uint8),
             torch.tensor(list(header), dtype=torch.uint8)]
    parts += [t.detach().cpu().contiguous().reshape(-1).view(torch.uint8) for t in tensors.values()]
    return torch.cat(parts)


def unpack(buffer: torch.Tensor) -> State:
    """The state `pack` made, tensors on the CPU with their bits unchanged."""
    data = buffer.cpu()
    length = int.from_bytes(bytes(data[:_HEADER_BYTES].tolist()), "little")
    header = json.loads(bytes(data[_HEADER_BYTES:_HEADER_BYTES + length].tolist()).decode())
    offset, tensors = _HEADER_BYTES + length, {}
    for name, dtype_name, shape in header["tensors"]:
        dtype = getattr(torch, dtype_name)
        numel = 1
        for size in shape:
            numel *= size
        size = numel * torch.empty((), dtype=dtype).element_size()
        # clone: a fresh storage, so the view by a wider dtype starts aligned
        tensors[name] = data[offset:offset + size].clone().view(dtype).reshape(shape)
        offset += size
    return header["meta"], tensors


def gather(state: State, ranks: Ranks) -> list[State]:
    """Every rank's state, in rank order (this rank's own among them, as it comes back)."""
    dist = torch.distributed
    buffer = pack(state).to(ranks.device)
    size = torch.tensor([buffer.numel()], dtype=torch.int64, device=ranks.device)
    sizes = [torch.zeros_like(size) for _ in range(ranks.world_size)]
    dist.all_gather(sizes, size)
    longest = max(int(s) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8, device=ranks.device)
    padded[:buffer.numel()] = buffer
    buffers = [torch.empty_like(padded) for _ in range(ranks.world_size)]
    dist.all_gather(buffers, padded)
    return [unpack(b[:int(s)]) for b, s in zip(buffers, sizes)]


def merge_rank_states(state: State, blank: Callable[[], Any], ranks: Ranks | None = None) -> Any:
    """A sink (made by `blank()`) holding the merge of every rank's `state`, in rank order.

    Raises:
        InvalidOptionError: two ranks whose sites, statistics, reduce or pairs differ, or
            whose values of a site kept other dimensions or sizes, naming both.
    """
    ranks = ranks or current_ranks()
    states = gather(state, ranks)
    check_match(states)
    merged = blank()
    for meta, tensors in states:
        part = blank()
        part.load_state(meta, tensors)
        merged.merge(part)
    return merged


def check_match(states: list[State]) -> None:
    """Refuse states that cannot merge: described otherwise, or a site whose values kept
    other dimensions or sizes (ranks that saw no value of it aside).

    Raises:
        InvalidOptionError: naming the two ranks and what each has.
    """
    first = states[0][0]
    for rank, (meta, _) in enumerate(states[1:], start=1):
        for key in ("sites", "stats", "reduce", "cka"):
            if meta[key] != first[key]:
                raise InvalidOptionError(
                    f"ranks 0 and {rank} computed statistics of other {key}: rank 0 has {first[key]}, rank "
                    f"{rank} has {meta[key]}; every rank must call statistics() with the same arguments")
    for i, site in enumerate(first["sites"]):
        seen = [(rank, meta["site_meta"][i]) for rank, (meta, _) in enumerate(states)
                if meta["site_meta"][i]["ndim"] >= 0]
        for rank, found in seen[1:]:
            here, there = seen[0]
            if [found[k] for k in ("ndim", "kept", "shape")] != [there[k] for k in ("ndim", "kept", "shape")]:
                raise InvalidOptionError(
                    f"site {site} has values of other shapes on ranks {here} and {rank}: rank {here} kept "
                    f"dimensions {there['kept']} of sizes {there['shape']} of {there['ndim']}-d values, rank "
                    f"{rank} kept {found['kept']} of sizes {found['shape']} of {found['ndim']}-d values; the "
                    "kept dimensions must have the same sizes in every batch: pool the ones that vary")
