"""Deal the blocks of a streamed dataset to DataLoader workers a whole batch at a time."""

from __future__ import annotations

from dataclasses import dataclass

from torch.utils.data import get_worker_info


@dataclass(frozen=True)
class BlockPlan:
    """Which blocks this process yields: batch b (blocks [b*B, (b+1)*B)) goes to worker b % W, from
    start on.
    """

    start: int = 0
    batch_size: int = 1
    worker: int = 0
    workers: int = 1

    def owns(self, index: int) -> bool:
        """True when block index is this worker's to produce (each block is produced exactly
        once).
        """
        if index < self.start:
            return False
        return ((index - self.start) // self.batch_size) % self.workers == self.worker


def block_plan(start: int, batch_size: int) -> BlockPlan:
    """Return the plan for the calling process; dealing whole batches keeps the batch order of a
    single process.
    """
    info = get_worker_info()
    if info is None:
        return BlockPlan(start, batch_size)
    return BlockPlan(start, batch_size, info.id, info.num_workers)


__all__ = ["BlockPlan", "block_plan"]
