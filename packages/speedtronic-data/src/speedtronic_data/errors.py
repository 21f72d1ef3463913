"""The one error type of speedtronic-data, and the checks its constructors and readers share."""

from __future__ import annotations

import errno
import numbers
import os
from pathlib import Path
from typing import Any


class DataError(ValueError):
    """A data file or data setting is unusable; the message names it and says how to fix it."""


def check_positive_int(owner: str, name: str, value: Any) -> None:
    """Raise DataError unless value is an integer >= 1 (a bool, float or string is not)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise DataError(f"{owner} {name} must be a positive integer, got {value!r}")
    if value < 1:
        raise DataError(f"{owner} {name} must be positive, got {value}")


def not_a_file(path: Path) -> str | None:
    """Return why path names something that is neither a regular file nor a folder, to follow
    its name in an error (a symlink loop, a dangling symlink, a pipe or a device); None when it
    is a file or folder, or nothing at all.
    """
    if path.is_file() or path.is_dir():
        return None
    try:
        path.stat()
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "is a symlink loop (its links lead back to themselves); point it at a file"
        if path.is_symlink():
            return f"is a symlink to {os.readlink(path)}, which does not exist"
        return None
    # A shell's <(zcat corpus.gz) is a pipe: it can be read once only, and its size is unknown.
    return "is a pipe, socket or device, not a regular file; save its text to a file first"


def unreadable(subject: str, error: OSError) -> DataError:
    """Return the DataError for a file that is there but cannot be read (no read permission, an
    I/O error): subject (the file, and the setting that gave it) and the system's reason.
    """
    return DataError(
        f"{subject} cannot be read ({error.strerror or error}); "
        "make it readable (check its permissions) or leave it out"
    )


__all__ = ["DataError", "check_positive_int", "not_a_file", "unreadable"]
