"""One warning when the Hub stops answering a kind of request, one when it answers again.

A node retries every request, on three lanes, with backoff; a warning per failed attempt and per
request given up on buried the log for as long as an outage lasted (a worker logged about a hundred
lines in a 45-second one). An outage begins with the first transient failure and ends once every
kind of request that failed in it (`upload`, `read`, `head`, ... : the first word of the
operation) has succeeded again; what fails in between is logged at DEBUG, or INFO for a request
given up on (see `HubUnavailable`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


class OutageLog:
    """Track one HubClient's outage and log its start and end (thread-safe)."""

    def __init__(
        self, repo_id: str, logger: logging.Logger, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.repo_id, self.logger, self.clock = repo_id, logger, clock
        self._lock = threading.Lock()
        self._failing: set[str] = set()
        self._since = 0.0
        self._failures = 0

    @property
    def active(self) -> bool:
        """Return whether an outage was announced and has not ended."""
        with self._lock:
            return bool(self._failing)

    def failed(self, operation: str, message: str) -> None:
        """Record a transient failure of operation; the first of an outage is the one warning."""
        with self._lock:
            first = not self._failing
            if first:
                self._since, self._failures = self.clock(), 0
            self._failing.add(operation.split(" ", 1)[0])
            self._failures += 1
        if first:
            self.logger.warning(
                "%s is not answering (%s); retrying with backoff while training goes on, and "
                "saying here when it answers again",
                self.repo_id,
                message,
            )
        else:
            self.logger.debug(message)

    def answered(self, operation: str) -> None:
        """Record a success of operation; the outage ends when every failing kind answered."""
        with self._lock:
            kind = operation.split(" ", 1)[0]
            if kind not in self._failing:
                return
            self._failing.discard(kind)
            if self._failing:
                return
            seconds, failures = self.clock() - self._since, self._failures
        # A warning too: the CLI shows a library's warnings only, and a user who saw the outage
        # begin must see it end.
        self.logger.warning(
            "%s answers again after %.0fs (%d failed requests, retried)",
            self.repo_id,
            seconds,
            failures,
        )


__all__ = ["OutageLog"]
