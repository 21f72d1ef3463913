"""Where a loader stands in its data: the epoch in progress, the samples handed out, and where the
next pass starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from speedtronic_data.errors import DataError


@dataclass
class DataPosition:
    """The position a ResumableLoader advances and a resumable dataset shares, so either can save
    and restore it.

    Only the process that consumes the batches knows how many were handed out (workers prefetch
    ahead), so the loader counts them here; a dataset holding the same object reports the exact
    position in its state_dict.
    """

    epoch: int = 0  # the pass in progress
    samples: int = 0  # samples of `epoch` handed out (a whole batch counts batch_size)
    next_epoch: int = 0  # where the next pass starts: a fresh epoch, or a loaded resume point
    next_samples: int = 0
    driven: bool = (
        False  # set by the ResumableLoader that advances it; until then the counts mean nothing
    )

    def start_pass(self) -> tuple[int, int]:
        """Begin the next pass and return its (epoch, samples to skip); the pass after it is a fresh
        epoch.
        """
        self.epoch, self.samples = self.next_epoch, self.next_samples
        self.next_epoch, self.next_samples = self.epoch + 1, 0
        return self.epoch, self.samples

    def end_pass(self, epoch: int) -> None:
        """Mark the pass over `epoch` run to its end: unless another pass began or a resume point
        was loaded since, the position is then the start of the next epoch, so a state saved after
        a for loop over the loader resumes there, not in an empty rest of `epoch`.
        """
        if self.epoch == epoch and (self.next_epoch, self.next_samples) == (epoch + 1, 0):
            self.epoch, self.samples = epoch + 1, 0

    def resume_at(self, epoch: int, samples: int, what: str) -> None:
        """Make the next pass continue `epoch` after `samples` samples; `what` names the state in
        errors.
        """
        if epoch < 0 or samples < 0:
            raise DataError(
                f"{what} has a negative epoch or position (epoch={epoch}, position={samples})"
            )
        self.epoch, self.samples = epoch, samples
        self.next_epoch, self.next_samples = epoch, samples


def read_state(state: Any, count_key: str, owner: str) -> tuple[int, int]:
    """Return (epoch, count) from a saved {"epoch", count_key} state, or a DataError naming the
    expected shape.
    """
    try:
        return int(state["epoch"]), int(state[count_key])
    except (KeyError, TypeError, ValueError):
        raise DataError(
            f"state {state!r} is not a {owner} state (expected "
            f"{{'epoch': int, '{count_key}': int}})"
        ) from None


__all__ = ["DataPosition", "read_state"]
