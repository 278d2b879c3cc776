"""Which process of a torch.distributed run this is, and which batches it takes."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from torchlog.errors import InvalidArgumentTypeError

__all__ = ["Ranks", "current_ranks"]


@dataclass(frozen=True, slots=True)
class Ranks:
    """This process's rank among `world_size` (0 of 1 outside torch.distributed), and the
    device the process group's collectives need their tensors on."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")  # cuda for an NCCL group

    def share(self, num_batches: int | None) -> range:
        """The batch indexes this rank takes: the rank-th of world_size contiguous blocks,
        as `torchlog.extract` shares them (rank r of n: batches r * N // n to
        (r + 1) * N // n - 1). Outside torch.distributed, every batch.

        Raises:
            InvalidArgumentTypeError: several ranks and data of unknown length.

        Example:
            >>> Ranks(1, 3).share(10)
            range(3, 6)
        """
        if self.world_size == 1:
            return range(0, 1 << 62) if num_batches is None else range(num_batches)
        if num_batches is None:
            raise InvalidArgumentTypeError(
                f"data of unknown length cannot be shared among {self.world_size} processes (each takes a "
                "contiguous block of batches); pass a tensor with batch_size, a list of batches or a "
                "DataLoader over a Dataset with __len__")
        return range(self.rank * num_batches // self.world_size, (self.rank + 1) * num_batches // self.world_size)


def current_ranks() -> Ranks:
    """This process's Ranks: from torch.distributed once its process group is initialised
    with more than one process, else rank 0 of 1."""
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return Ranks()
    nccl = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    return Ranks(dist.get_rank(), dist.get_world_size(), device)
