"""Finding a module's own gradient-checkpointing switch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def gradient_checkpointing_switch(
    module: Any, enabled: bool
) -> tuple[str, Callable[[], Any]] | None:
    """Return (the call's name, a callable that makes it) switching `module`'s gradient
    checkpointing on or off through its own hook, or None when it has none.

    A module opts in with `set_gradient_checkpointing(enabled)`; a transformers model has the pair
    `activation_checkpointing_enable()` / `_disable()` (older releases:
    `gradient_checkpointing_enable()` / `_disable()`).
    """
    own = getattr(module, "set_gradient_checkpointing", None)
    if callable(own):
        return f"set_gradient_checkpointing({enabled})", lambda: own(enabled)
    # Newer transformers 5 releases renamed the pair (the old names warn; gone in 6).
    verb = "enable" if enabled else "disable"
    for name in (f"activation_checkpointing_{verb}", f"gradient_checkpointing_{verb}"):
        switch = getattr(module, name, None)
        if callable(switch):
            return f"{name}()", switch
    return None


__all__ = ["gradient_checkpointing_switch"]
