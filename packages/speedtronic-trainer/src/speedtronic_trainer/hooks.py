"""Metric hooks: the protocol, delivery to a hook object or function, and fan-out helpers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class TrainingHook(Protocol):
    def on_event(self, event: str, payload: dict[str, Any]) -> None: ...


def deliver(hook: Any, event: str, payload: dict[str, Any]) -> None:
    """Send one event to an object with on_event, or to a plain (event, payload) callable."""
    if hasattr(hook, "on_event"):
        hook.on_event(event, payload)
    else:
        hook(event, payload)


def hook_name(hook: Any) -> str:
    """Return a readable name for a hook in warnings."""
    return getattr(hook, "__qualname__", None) or type(hook).__name__


class CallbackList:
    """Fan-out adapter for optional W&B/TensorBoard-style callbacks."""

    def __init__(self, callbacks: list[Any] | None = None) -> None:
        self.callbacks = list(callbacks or [])

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        """Deliver the event to every callback in order, then raise the first failure."""
        _each(self.callbacks, lambda callback: deliver(callback, event, payload))

    def close(self) -> None:
        """Close every callback that can be closed, then raise the first failure."""
        _each(self.callbacks, _close)


def _close(callback: Any) -> None:
    close = getattr(callback, "close", None)
    if callable(close):
        close()


def _each(callbacks: list[Any], action: Callable[[Any], None]) -> None:
    """Apply action to every callback, then raise the first failure: one broken sink (W&B
    offline) must not starve the others of events, nor leave them unflushed at close.
    """
    first: Exception | None = None
    for callback in callbacks:
        try:
            action(callback)
        except Exception as exc:
            first = first or exc
    if first is not None:
        raise first


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


__all__ = ["CallbackList", "TrainingHook", "deliver", "hook_name", "on_event"]
