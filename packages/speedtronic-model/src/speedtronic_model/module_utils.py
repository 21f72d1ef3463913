"""Small public helpers for user modules."""

from __future__ import annotations

import warnings
from typing import Any


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
    hook = _hook(module, enabled)
    if hook is None:
        if enabled:
            warnings.warn(
                f"{type(module).__name__} has no set_gradient_checkpointing(enabled) method; "
                "gradient checkpointing stays off. Add that method to the module to opt in.",
                GradientCheckpointingWarning,
                stacklevel=2,
            )
        return module
    try:
        hook()
    except Exception as exc:  # a user hook may fail in any way; the run goes on without it
        warnings.warn(
            f"{type(module).__name__}.set_gradient_checkpointing({enabled}) failed: {exc!r}; "
            "continuing with the module's previous setting.",
            GradientCheckpointingWarning,
            stacklevel=2,
        )
    return module


def _hook(module: Any, enabled: bool):
    own = getattr(module, "set_gradient_checkpointing", None)
    if callable(own):
        return lambda: own(enabled)
    # Newer transformers 5 releases renamed the pair (the old names warn; gone in 6).
    verb = "enable" if enabled else "disable"
    for name in (f"activation_checkpointing_{verb}", f"gradient_checkpointing_{verb}"):
        hf = getattr(module, name, None)
        if callable(hf):
            return hf
    return None


__all__ = ["GradientCheckpointingWarning", "set_gradient_checkpointing"]
