"""Errors and exit codes shared by the CLI and the library modules it calls."""

from __future__ import annotations

import signal
import sys

USAGE_ERROR = 2
RUNTIME_ERROR = 1
# A run a signal stopped exits 128 + the signal's number, as a shell reports a signal death, so a
# scheduler tells it from a finished run (0) and a failure (1): 143 for SIGTERM, 130 for SIGINT.
SIGNAL_EXIT_BASE = 128
# stdout's reader left early (`speedtronic validate CONFIG | head`): what a shell reports for a
# tool SIGPIPE ended (128 + 13), so `set -o pipefail` still tells it from success.
BROKEN_PIPE_EXIT = SIGNAL_EXIT_BASE + 13

# What a data-parallel rank says when a collective failed because a peer rank died or left: that
# peer's own line says what went wrong, gloo's text here would read as this rank's failure.
PEER_FAILED = "stopped because another rank failed (see that rank's error)"
# gloo's words for a peer whose process ended mid-collective: its socket closed or reset, or a
# write to it found the pipe broken ("Connection closed by peer ... a remote worker crashing").
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def signal_exit_code(name: str) -> int:
    """Return the exit code of a run stopped by the signal `name` (SIGTERM: 143, SIGINT: 130)."""
    return SIGNAL_EXIT_BASE + signal.Signals[name].value


def first_line(error: BaseException) -> str:
    """Return the first non-empty line of an error's message, stripped ("" when it has none)."""
    return next((line.strip() for line in str(error).splitlines() if line.strip()), "")


def peer_failed(error: BaseException) -> bool:
    """Return True when `error`, or an error it was raised from, is gloo's for a peer rank whose
    connection closed mid-collective (that rank failed or was killed).
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        # torch raises gloo's errors as RuntimeError (DistBackendError is one); the message names
        # gloo's transport source file.
        if isinstance(current, RuntimeError) and "gloo" in text:
            if any(words in text for words in _PEER_GONE):
                return True
        current = current.__cause__ or current.__context__
    return False


def print_line(text: str) -> None:
    """Print `text` and its newline on stderr in one write: print() writes them apart, and under
    torchrun the workers share one terminal, where another's line could run into this one.
    """
    sys.stderr.write(f"{text}\n")
    sys.stderr.flush()


class UsageError(Exception):
    """A user mistake (a missing file, a bad argument): printed in one line, exit code 2."""


class RunFailed(RuntimeError):
    """A training run failed after it started; the message says what was saved and how to go on
    (exit code 1).
    """


__all__ = [
    "BROKEN_PIPE_EXIT",
    "PEER_FAILED",
    "RUNTIME_ERROR",
    "SIGNAL_EXIT_BASE",
    "USAGE_ERROR",
    "RunFailed",
    "UsageError",
    "first_line",
    "peer_failed",
    "print_line",
    "signal_exit_code",
]
