"""Errors and exit codes shared by the CLI and the library modules it calls."""

from __future__ import annotations

USAGE_ERROR = 2
RUNTIME_ERROR = 1


class UsageError(Exception):
    """A user mistake (a missing file, a bad argument): printed in one line, exit code 2."""


__all__ = ["RUNTIME_ERROR", "USAGE_ERROR", "UsageError"]
