"""Deal the blocks of a streamed dataset to data-parallel ranks, then to DataLoader workers, a
whole batch at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.utils.data import get_worker_info


@dataclass(frozen=True)
class BlockPlan:
    """Which blocks this process yields. Batch g of the stream (blocks [g*B, (g+1)*B)) belongs to
    rank g % R; that rank's batches are dealt to its workers in turn, from its sample `start` on.
    """

    start: int = 0  # samples of this rank's share already consumed (a resume point)
    batch_size: int = 1
    worker: int = 0
    workers: int = 1
    rank: int = 0
    world_size: int = 1

    def owns(self, index: int) -> bool:
        """True when block index is this process's to produce (each block is produced once)."""
        batch, offset = divmod(index, self.batch_size)
        if batch % self.world_size != self.rank:
            return False
        local = (batch // self.world_size) * self.batch_size + offset  # in this rank's share
        if local < self.start:
            return False
        return ((local - self.start) // self.batch_size) % self.workers == self.worker


def block_plan(start: int, batch_size: int, rank: int = 0, world_size: int = 1) -> BlockPlan:
    """Return the plan for the calling process; dealing whole batches keeps the batch order of a
    single process within each rank.
    """
    info = get_worker_info()
    if info is None:
        return BlockPlan(start, batch_size, rank=rank, world_size=world_size)
    return BlockPlan(start, batch_size, info.id, info.num_workers, rank, world_size)


__all__ = ["BlockPlan", "block_plan"]
