"""An endless batch stream over a finite loader that records where it is, so a resume continues
exactly there.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch


def _generators(loader: Any) -> list[torch.Generator | None]:
    """Return the RNG generators a DataLoader draws from at the start of an epoch (loader, then
    sampler).
    """
    sampler = getattr(loader, "sampler", None)
    return [
        g if isinstance(g, torch.Generator) else None
        for g in (getattr(loader, "generator", None), getattr(sampler, "generator", None))
    ]


def _stateful_source(loader: Any) -> tuple[str, Any] | None:
    """Return the first of loader, dataset, sampler, batch_sampler that offers
    state_dict/load_state_dict.
    """
    for name in ("loader", "dataset", "sampler", "batch_sampler"):
        obj = loader if name == "loader" else getattr(loader, name, None)
        if callable(getattr(obj, "state_dict", None)) and callable(
            getattr(obj, "load_state_dict", None)
        ):
            return name, obj
    return None


class BatchStream:
    """Cycle a finite loader forever, tracking epoch and batches consumed for exact resume."""

    def __init__(self, loader: Iterable[Any]) -> None:
        self.loader = loader
        self.epoch = 0
        self.consumed = 0  # batches taken from the current epoch
        self._iterator: Iterator[Any] | None = None
        self._epoch_rng: dict[str, Any] | None = None
        self._resume_skip: int | None = (
            None  # batches to replay when the first epoch after a resume starts
        )

    def _capture_epoch_rng(self) -> dict[str, Any]:
        return {
            "torch": torch.get_rng_state(),
            "generators": [
                g.get_state() if g is not None else None for g in _generators(self.loader)
            ],
        }

    def _start_epoch(self) -> Any:
        """Open a new pass over the loader and return its first batch."""
        self._epoch_rng = self._capture_epoch_rng()
        self._iterator = iter(self.loader)
        # Taking the first batch here pins every epoch-start RNG draw (sampler permutation, worker
        # seeds) to this moment, which is what lets a resume replay it.
        try:
            return next(self._iterator)
        except StopIteration:
            raise ValueError(
                "the dataloader produced no batches; check the dataset size, batch size and "
                "drop_last"
            ) from None

    def _replay_epoch(self, skip: int) -> None:
        """Re-open the interrupted epoch with its original RNG and skip the batches it had
        consumed.
        """
        saved = torch.get_rng_state()
        torch.set_rng_state(self._epoch_rng["torch"])
        for generator, state in zip(
            _generators(self.loader), self._epoch_rng["generators"], strict=False
        ):
            if generator is not None and state is not None:
                generator.set_state(state)
        self._iterator = iter(self.loader)
        # A stateful source has restored its own position; other loaders are fast-forwarded.
        for _ in range(skip if _stateful_source(self.loader) is None else 0):
            next(self._iterator)
        torch.set_rng_state(saved)

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> Any:
        if self._resume_skip is not None:
            skip, self._resume_skip = self._resume_skip, None
            if self.consumed > 0:
                self._replay_epoch(skip)
        if self._iterator is None:
            batch = self._start_epoch()
        else:
            try:
                batch = next(self._iterator)
            except StopIteration:
                if iter(self.loader) is self.loader:
                    raise ValueError(
                        "the batch iterator is exhausted and cannot restart; pass a re-iterable "
                        "loader (a DataLoader or a list) or lower max_steps"
                    ) from None
                self.epoch += 1
                self.consumed = 0
                batch = self._start_epoch()
        self.consumed += 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        """Return the epoch, batches consumed, epoch-start RNG and any loader/dataset/sampler
        state.
        """
        state: dict[str, Any] = {
            "epoch": self.epoch,
            "consumed": self.consumed,
            "epoch_rng": self._epoch_rng,
        }
        source = _stateful_source(self.loader)
        if source is not None:
            state["source"] = {"kind": source[0], "state": source[1].state_dict()}
        return state

    def resumes_exactly(self, state: Any) -> bool:
        """Return True when load_state_dict(state) continues at the saved sample even where the
        batch size changed: the loader saved its own position and says so (a ResumableLoader
        counts samples); batches fast-forwarded here are counted in the new size.
        """
        source = _stateful_source(self.loader)
        saved = state.get("source") if isinstance(state, dict) else None
        check = getattr(source[1], "resumes_exactly", None) if source is not None else None
        if not callable(check) or not isinstance(saved, dict) or saved.get("kind") != source[0]:
            return False
        return bool(check(saved.get("state")))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position saved by state_dict; the next batch is the one that followed it."""
        self.epoch = int(state["epoch"])
        self.consumed = int(state["consumed"])
        self._epoch_rng = state.get("epoch_rng")
        self._iterator = None
        source = _stateful_source(self.loader)
        if "source" in state and source is not None:
            source[1].load_state_dict(state["source"]["state"])
        self._resume_skip = self.consumed if self._epoch_rng is not None else None


__all__ = ["BatchStream"]
