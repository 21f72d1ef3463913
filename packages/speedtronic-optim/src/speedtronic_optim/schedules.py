"""LR multipliers (warmup + cosine / constant / stable-decay) and their LambdaLR builder."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from speedtronic_optim.checks import as_section, check_arguments, check_integer

WARMUP_FLOOR = 1e-8
# The schedule defaults, written once (speedtronic-config's SchedulerConfig is tested to agree).
DEFAULT_WARMUP_STEPS = 100
DEFAULT_MAX_STEPS = 1000
DEFAULT_MIN_LR_RATIO = 0.1
DEFAULT_DECAY_RATIO = 0.2


def _warmup(step: int, warmup_steps: int) -> float:
    return max(WARMUP_FLOOR, (step + 1) / warmup_steps)


def _checks_arguments(multiplier: Callable[..., float]) -> Callable[..., float]:
    """Return ``multiplier`` behind checks of its step and settings, for a direct call.

    The scheduler binds the unchecked ``multiplier`` (``__wrapped__``): lr_lambda checks the
    settings once, and LambdaLR passes whole steps from 0.
    """
    name, settings_names = multiplier.__name__, multiplier.__kwdefaults__

    @functools.wraps(multiplier)
    def checked(step: int, **settings: Any) -> float:
        check_integer(f"{name} step", step, 0)
        # An unknown keyword is left to the call below, which refuses it as Python does.
        check_arguments(name, **{k: v for k, v in settings.items() if k in settings_names})
        return multiplier(step, **settings)

    return checked


@_checks_arguments
def warmup_cosine(
    step: int,
    *,
    warmup_steps: int = DEFAULT_WARMUP_STEPS,
    max_steps: int = DEFAULT_MAX_STEPS,
    min_lr_ratio: float = DEFAULT_MIN_LR_RATIO,
) -> float:
    """Return the LR factor: warmup, then cosine 1 -> ``min_lr_ratio`` (progress clamped)."""
    if step < warmup_steps:
        return _warmup(step, warmup_steps)
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    progress = min(1.0, max(0.0, progress))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


@_checks_arguments
def warmup_constant(step: int, *, warmup_steps: int = DEFAULT_WARMUP_STEPS) -> float:
    """Return the LR multiplier: linear warmup, then 1."""
    return _warmup(step, warmup_steps) if step < warmup_steps else 1.0


@_checks_arguments
def warmup_stable_decay(
    step: int,
    *,
    warmup_steps: int = DEFAULT_WARMUP_STEPS,
    max_steps: int = DEFAULT_MAX_STEPS,
    min_lr_ratio: float = DEFAULT_MIN_LR_RATIO,
    decay_ratio: float = DEFAULT_DECAY_RATIO,
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
    # LambdaLR runs the update of step s (0-based) at factor(s), so the run's last update,
    # max_steps - 1, ends the decay at min_lr_ratio and the window's first one already decays.
    progress = min(1.0, (step - decay_start + 1) / max(1, max_steps - decay_start))
    return 1.0 - (1.0 - min_lr_ratio) * progress


# The unchecked multipliers: lr_lambda checks a section's settings once, not every step.
_SCHEDULES: dict[str, Callable[..., float]] = {
    "cosine": warmup_cosine.__wrapped__,
    "constant": warmup_constant.__wrapped__,
    "wsd": warmup_stable_decay.__wrapped__,
}
_FIELDS = {
    "cosine": ("warmup_steps", "max_steps", "min_lr_ratio"),
    "constant": ("warmup_steps",),
    "wsd": ("warmup_steps", "max_steps", "min_lr_ratio", "decay_ratio"),
}
# Every SchedulerConfig field (a schedule ignores those it does not read).
_SECTION_FIELDS = frozenset({"name", *(field for names in _FIELDS.values() for field in names)})


def lr_lambda(scheduler_section: Any) -> Callable[[int], float]:
    """Return the multiplier function a scheduler section (object or mapping) names: cosine,
    constant or wsd. A field the section lacks keeps the schedule function's default; one of the
    wrong type or range raises naming it.
    """
    section = as_section(scheduler_section, "scheduler section", _SECTION_FIELDS)
    name = getattr(section, "name", None)
    if name not in _SCHEDULES:
        raise ValueError(f"scheduler name {name!r} is not supported; use one of {list(_SCHEDULES)}")
    given = {
        field: getattr(section, field)
        for field in _FIELDS[name]
        if getattr(section, field, None) is not None
    }
    # Checked once here: the multipliers run every step and a bad value would surface there.
    check_arguments("scheduler section", **given)
    return functools.partial(_SCHEDULES[name], **given)


def build_lr_scheduler(optimizer: Optimizer, scheduler_section: Any) -> LambdaLR:
    """Return a LambdaLR for a section (name, warmup_steps, max_steps, min_lr_ratio, ...)."""
    if not isinstance(optimizer, Optimizer):
        raise TypeError(
            "build_lr_scheduler optimizer: expected a torch.optim.Optimizer, got "
            f"{type(optimizer).__name__}; pass the optimizer the schedule drives"
        )
    return LambdaLR(optimizer, lr_lambda(scheduler_section))
