"""Turn SIGTERM/SIGINT into a stop request the training loop honours at the next step boundary."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignal:
    """Context manager that records a termination signal instead of dying mid-step.

    `on_signal` runs in the handler after the first signal is recorded: it may only set flags
    (taking a lock the interrupted code holds would deadlock). A second signal ends the process
    at once unless `repeat_exits` is False: a torchrun worker hears a scheduler's signal twice
    (sent to every process, then passed on by torchrun), and torchrun kills it itself if it does
    not stop. Such a worker, once stopped or failed, then ignores both signals until it exits:
    the repeat may land after the loop, while the checkpointed run still reports and leaves, and
    torchrun signals every worker as soon as one fails, while a failed one still reports its
    error (torchrun kills a worker that does not leave in time).
    """

    def __init__(
        self,
        enabled: bool = True,
        on_signal: Callable[[], None] | None = None,
        repeat_exits: bool = True,
    ) -> None:
        self.enabled = enabled
        self.on_signal = on_signal
        self.repeat_exits = repeat_exits
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:
            if not self.repeat_exits:
                return
            # A second signal means the user really wants out now.
            signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
            signal.raise_signal(signum)
            return
        self.received = signal.Signals(signum).name
        if self.on_signal is not None:
            self.on_signal()

    def __enter__(self) -> StopSignal:
        # Handlers can only be installed from the main thread; elsewhere signals keep their default.
        if self.enabled and threading.current_thread() is threading.main_thread():
            for signum in _SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        leaving = not self.repeat_exits and (self.received is not None or exc_type is not None)
        for signum, handler in self._previous.items():
            signal.signal(signum, signal.SIG_IGN if leaving else handler)
        self._previous.clear()


__all__ = ["StopSignal"]
