"""Optional hook and callback helpers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class _EventCallback:
    """Adapt a plain `(event, payload)` function to the object hook protocol."""

    def __init__(self, callback: Callable[[str, dict[str, Any]], None]) -> None:
        if not callable(callback):
            raise TypeError(
                "on_event() needs a callable taking (event, payload), got "
                f"{type(callback).__name__}"
            )
        self.callback = callback
        self.__qualname__ = getattr(callback, "__qualname__", type(callback).__name__)

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        self.callback(event, payload)


def on_event(callback: Callable[[str, dict[str, Any]], None]) -> _EventCallback:
    """Return a callback wrapper suitable for MetricLogger(hooks=...)."""
    return _EventCallback(callback)


__all__ = ["on_event"]
