"""The one error type of speedtronic-data, and the size check its constructors share."""

from __future__ import annotations

import numbers
from typing import Any


class DataError(ValueError):
    """A data file or data setting is unusable; the message names it and says how to fix it."""


def check_positive_int(owner: str, name: str, value: Any) -> None:
    """Raise DataError unless value is an integer >= 1 (a bool, float or string is not)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise DataError(f"{owner} {name} must be a positive integer, got {value!r}")
    if value < 1:
        raise DataError(f"{owner} {name} must be positive, got {value}")


__all__ = ["DataError", "check_positive_int"]
