"""The one error type of speedtronic-data."""

from __future__ import annotations


class DataError(ValueError):
    """A data file or data setting is unusable; the message names it and says how to fix it."""


__all__ = ["DataError"]
