"""LR multipliers (warmup + cosine / constant / stable-decay) and their LambdaLR builder."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

SCHEDULE_NAMES = ("cosine", "constant", "wsd")
WARMUP_FLOOR = 1e-8


def _warmup(step: int, warmup_steps: int) -> float:
    return max(WARMUP_FLOOR, (step + 1) / warmup_steps)


def warmup_cosine(step: int, *, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """Return the LR factor: warmup, then cosine 1 -> ``min_lr_ratio`` (progress clamped)."""
    if step < warmup_steps:
        return _warmup(step, warmup_steps)
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    progress = min(1.0, max(0.0, progress))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_constant(step: int, *, warmup_steps: int) -> float:
    """Return the LR multiplier: linear warmup, then 1."""
    return _warmup(step, warmup_steps) if step < warmup_steps else 1.0


def warmup_stable_decay(
    step: int, *, warmup_steps: int, max_steps: int, min_lr_ratio: float, decay_ratio: float = 0.2
) -> float:
    """Return the LR factor: warmup, hold 1, then linear decay to ``min_lr_ratio``.

    The decay spans the last ``decay_ratio`` of ``max_steps`` (never starting inside the warmup).
    """
    if step < warmup_steps:
        return _warmup(step, warmup_steps)
    decay_steps = max(1, round(decay_ratio * max_steps))
    decay_start = max(warmup_steps, max_steps - decay_steps)
    if step < decay_start:
        return 1.0
    progress = min(1.0, (step - decay_start) / max(1, max_steps - decay_start))
    return 1.0 - (1.0 - min_lr_ratio) * progress


def _check(section: Any) -> tuple[str, int, int, float, float]:
    name = str(getattr(section, "name", "cosine")).lower()
    warmup_steps = int(getattr(section, "warmup_steps", 100))
    max_steps = int(getattr(section, "max_steps", 1000))
    min_lr_ratio = float(getattr(section, "min_lr_ratio", 0.1))
    decay_ratio = float(getattr(section, "decay_ratio", 0.2))
    if name not in SCHEDULE_NAMES:
        raise ValueError(f"scheduler.name = {name!r} is not supported; use one of {SCHEDULE_NAMES}")
    if warmup_steps < 0:
        raise ValueError(f"scheduler.warmup_steps = {warmup_steps} must be >= 0")
    if max_steps <= 0:
        raise ValueError(f"scheduler.max_steps = {max_steps} must be > 0")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"scheduler.min_lr_ratio = {min_lr_ratio} must be in [0, 1]")
    if not 0.0 < decay_ratio <= 1.0:
        raise ValueError(f"scheduler.decay_ratio = {decay_ratio} must be in (0, 1]")
    return name, warmup_steps, max_steps, min_lr_ratio, decay_ratio


def lr_lambda(scheduler_section: Any) -> Callable[[int], float]:
    """Return the validated multiplier function for a duck-typed scheduler section."""
    name, warmup_steps, max_steps, min_lr_ratio, decay_ratio = _check(scheduler_section)
    if name == "constant":
        return functools.partial(warmup_constant, warmup_steps=warmup_steps)
    if name == "wsd":
        return functools.partial(
            warmup_stable_decay,
            warmup_steps=warmup_steps,
            max_steps=max_steps,
            min_lr_ratio=min_lr_ratio,
            decay_ratio=decay_ratio,
        )
    return functools.partial(
        warmup_cosine, warmup_steps=warmup_steps, max_steps=max_steps, min_lr_ratio=min_lr_ratio
    )


def build_lr_scheduler(optimizer: Optimizer, scheduler_section: Any) -> LambdaLR:
    """Return a LambdaLR for a section (name, warmup_steps, max_steps, min_lr_ratio, ...)."""
    return LambdaLR(optimizer, lr_lambda(scheduler_section))
