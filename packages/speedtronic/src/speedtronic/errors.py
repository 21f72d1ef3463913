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


def signal_exit_code(name: str) -> int:
    """Return the exit code of a run stopped by the signal `name` (SIGTERM: 143, SIGINT: 130)."""
    return SIGNAL_EXIT_BASE + signal.Signals[name].value


def first_line(error: BaseException) -> str:
    """Return the first non-empty line of an error's message, stripped ("" when it has none)."""
    return next((line.strip() for line in str(error).splitlines() if line.strip()), "")


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
    "RUNTIME_ERROR",
    "SIGNAL_EXIT_BASE",
    "USAGE_ERROR",
    "RunFailed",
    "UsageError",
    "first_line",
    "print_line",
    "signal_exit_code",
]
