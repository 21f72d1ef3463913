"""Where a step is, so that a run failing mid-step can still save the last sound state it had."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from speedtronic_trainer.checkpoint import capture_rng_state

BETWEEN_STEPS, FORWARD, UPDATING = "between steps", "forward", "updating"


@dataclass
class StepGuard:
    """The phase of the step in progress, and the data position, skip count and RNG it began with.

    Before the update (FORWARD) the model and optimizer still hold the previous step, so a
    checkpoint of them with the step's starting data position and RNG is that step exactly; while
    the update is applied (UPDATING) the parameters may be half-written and nothing is saved;
    after it (BETWEEN_STEPS) the live state is the completed step.
    """

    phase: str = BETWEEN_STEPS
    start: dict[str, Any] = field(default_factory=dict)

    def begin(self, start: dict[str, Any] | None) -> None:
        """Start a step; record `start` (the checkpoint entries the step may change before its
        update: data position, skipped-update count) and the RNG, unless start is None: nothing
        will be saved from this step. Every step: a failure after a draw (dropout, then an
        out-of-memory) cannot rewind the RNG otherwise. About 45 us on CPU, 3/4 of it NumPy's
        get_state; CUDA generator states are host-side (seed, offset): no device copy or sync.
        """
        self.start = {} if start is None else {**start, "rng": capture_rng_state()}
        self.phase = FORWARD

    def updating(self) -> None:
        """Mark that the optimizer update is being applied."""
        self.phase = UPDATING

    def applied(self) -> None:
        """Mark that the update and the step counters are complete."""
        self.phase = BETWEEN_STEPS

    def failing_step(self, step: int) -> int:
        """Return the step a failure happened in, given the trainer's completed-step counter."""
        return step if self.phase == BETWEEN_STEPS else step + 1

    def sound_state(
        self, model: torch.nn.Module, state_dict: Callable[[], dict[str, Any]]
    ) -> dict[str, Any] | None:
        """Return a checkpoint state of the last complete step, or None when the model may be
        half-updated or holds a non-finite parameter.
        """
        if self.phase == UPDATING or not parameters_finite(model):
            return None
        state = state_dict()
        if self.phase == FORWARD:
            state.update(self.start)  # rewind what the failed step had consumed
        return state


def parameters_finite(model: torch.nn.Module) -> bool:
    """Return True when every parameter of the model is finite."""
    with torch.no_grad():
        return all(bool(torch.isfinite(p).all()) for p in model.parameters())


__all__ = ["BETWEEN_STEPS", "FORWARD", "UPDATING", "StepGuard", "parameters_finite"]
