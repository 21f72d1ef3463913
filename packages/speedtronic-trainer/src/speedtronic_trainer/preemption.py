"""Turn SIGTERM/SIGINT into a stop request the training loop honours at the next step boundary."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignal:
    """Context manager that records a termination signal instead of dying mid-step."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:
            # A second signal means the user really wants out now.
            signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
            signal.raise_signal(signum)
            return
        self.received = signal.Signals(signum).name

    def __enter__(self) -> StopSignal:
        # Handlers can only be installed from the main thread; elsewhere signals keep their default.
        if self.enabled and threading.current_thread() is threading.main_thread():
            for signum in _SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()


__all__ = ["StopSignal"]
