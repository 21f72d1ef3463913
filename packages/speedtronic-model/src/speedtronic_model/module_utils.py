"""Small public helpers for user modules."""

from __future__ import annotations

import warnings
from typing import Any

from speedtronic_systems.checkpointing import gradient_checkpointing_switch


class GradientCheckpointingWarning(UserWarning):
    """A module could not switch gradient checkpointing; training continues without the change."""


def set_gradient_checkpointing(module: Any, enabled: bool = True) -> Any:
    """Switch a module's gradient checkpointing through its own hook and return the module.

    Speedtronic does not inspect transformer internals: a module opts in by exposing
    `set_gradient_checkpointing(enabled)`, or the Hugging Face pair
    `activation_checkpointing_enable()` / `_disable()` (older transformers:
    `gradient_checkpointing_enable()` / `_disable()`). A missing or failing
    hook warns (GradientCheckpointingWarning) instead of stopping the run (docs/architecture.md,
    failure policies).
    """
    switch = gradient_checkpointing_switch(module, enabled)
    if switch is None:
        if enabled:
            warnings.warn(
                f"{type(module).__name__} has no set_gradient_checkpointing(enabled) method; "
                "gradient checkpointing stays off. Add that method to the module to opt in.",
                GradientCheckpointingWarning,
                stacklevel=2,
            )
        return module
    name, hook = switch
    try:
        hook()
    except Exception as exc:  # a user hook may fail in any way; the run goes on without it
        warnings.warn(
            f"{type(module).__name__}.{name} failed: {exc!r}; "
            "continuing with the module's previous setting.",
            GradientCheckpointingWarning,
            stacklevel=2,
        )
    return module


__all__ = ["GradientCheckpointingWarning", "set_gradient_checkpointing"]
