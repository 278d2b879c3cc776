"""The processes of a distributed extract: this rank, agreeing to start, global progress, and the end.

Ranks never lock anything together while they run: they only meet through the process
group's key-value store (the TCPStore torchrun sets up), which works the same under the
gloo and NCCL backends and needs no tensor on any device: once to agree that every rank
can start, once per batch to add to the global count, and at the end, when rank 0 waits
for every shard before joining them and the others wait for the joined file.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from torchlog.errors import DistributedExtractError

__all__ = ["Group", "current_group"]

# Ranks may wait long for each other (a first batch of a big model, a rank resuming far
# behind the others); torchrun ends every rank when one dies, so nobody waits for a dead one.
_PATIENCE = timedelta(days=7)
_runs = itertools.count()  # every rank calls extract in the same order: one key prefix per call


@dataclass
class Group:
    """This process's place in the extract: rank, world size, and the store the ranks share
    (None in a single process)."""

    rank: int = 0
    world_size: int = 1
    store: Any = None
    prefix: str = "torchlog/extract/0"
    num_counted: int = 0  # batches counted by this process (the global count without a store)

    def agree(self, problem: BaseException | None) -> None:
        """Say whether this rank can start, and learn whether all can.

        Raises:
            `problem` itself on the rank that had it.
            DistributedExtractError: on the other ranks, naming the rank and its message.
        """
        if self.store is not None:
            text = "" if problem is None else f"{type(problem).__name__}: {problem}"
            self.store.set(f"{self.prefix}/start/{self.rank}", text.encode() or b"ok")
            keys = [f"{self.prefix}/start/{r}" for r in range(self.world_size)]
            self.store.wait(keys, _PATIENCE)
            if problem is None:
                for rank, key in enumerate(keys):
                    said = self.store.get(key).decode()
                    if said != "ok":
                        raise DistributedExtractError(
                            f"rank {rank} of {self.world_size} cannot start the extract, so no rank "
                            f"wrote anything: {said}")
        if problem is not None:
            raise problem

    def count(self, num_batches: int) -> int:
        """Add this rank's finished batches to the global count; return the global count."""
        if self.store is None:
            self.num_counted += num_batches
            return self.num_counted
        return int(self.store.add(f"{self.prefix}/batches", num_batches))

    def finish(self, join: Any) -> None:
        """End the extract together: rank 0 waits for every rank's shard, then calls `join()`;
        the others wait until it did.

        Raises:
            DistributedExtractError: on ranks other than 0, when rank 0 could not join.
            Whatever `join` raises, on rank 0.
        """
        if self.store is None:
            join()
            return
        self.store.set(f"{self.prefix}/done/{self.rank}", b"ok")
        joined = f"{self.prefix}/joined"
        if self.rank == 0:
            self.store.wait([f"{self.prefix}/done/{r}" for r in range(self.world_size)], _PATIENCE)
            try:
                join()
            except BaseException as exc:
                self.store.set(joined, f"{type(exc).__name__}: {exc}".encode())
                raise
            self.store.set(joined, b"ok")
            return
        self.store.wait([joined], _PATIENCE)
        said = self.store.get(joined).decode()
        if said != "ok":
            raise DistributedExtractError(f"rank 0 could not join the shards: {said}")


def current_group() -> Group:
    """The group of this process: from torch.distributed once initialised, else a single process."""
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return Group()
    store = dist.distributed_c10d._get_default_store()
    return Group(dist.get_rank(), dist.get_world_size(), store, f"torchlog/extract/{next(_runs)}")
