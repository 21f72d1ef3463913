"""The one exception every invalid configuration raises, and the mark of an every-rank error.

An error every rank of a data-parallel group raises alike is marked, so the CLI prints it once.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any, TypeVar

from speedtronic_config.secrets import describe_hidden, is_secret_path

_NO_VALUE = object()
# Why a value or key the user wrote as text reads as True or False.
YAML_BOOLEANS = "YAML 1.1 reads a bare yes, no, on, off, true or false as a boolean"
_EVERY_RANK = "raised_on_every_rank"  # the attribute on_every_rank sets
_Error = TypeVar("_Error", bound=BaseException)


class ConfigError(ValueError):
    """Raised when a run configuration is invalid; names the dotted path, the value and what is
    allowed. The value of a secret setting (distributed.token) is never kept or shown.
    """

    def __init__(
        self,
        path: str = "",
        problem: str | None = None,
        *,
        value: Any = _NO_VALUE,
        allowed: str | None = None,
    ) -> None:
        if problem is None:  # 2.0's form, a plain ValueError: ConfigError("whole message")
            path, problem = "", path
        secret = value is not _NO_VALUE and value is not None and is_secret_path(path)
        self.path = path
        self.problem = problem
        self.value = None if value is _NO_VALUE or secret else value
        self.allowed = allowed
        message = f"{path}: {problem}" if path else problem
        if secret:
            message += f" (got {describe_hidden(value)})"
        elif value is not _NO_VALUE:
            message += f" (got {_shown(value)})"
        if allowed:
            message += f"; {allowed}"
        super().__init__(_printable(message))

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (to cross a process boundary) as the finished message and fields: running
        # __init__ again would need arguments a hidden secret no longer has.
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls: type[ConfigError], args: tuple[Any, ...], state: dict[str, Any]) -> ConfigError:
    """Return an unpickled ConfigError (or subclass) with its message and fields."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


def _shown(value: Any) -> str:
    """Return a value for an error line: its repr, cut after 80 characters (a 400-digit number,
    a long list); an integer past Python's digit limit, which has no repr, by its size."""
    try:
        text = repr(value)
    except ValueError:
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    return text if len(text) <= 80 else f"{text[:77]}..."


def _printable(text: str) -> str:
    """Escape control characters (a key may hold a newline) so the message stays one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def unknown_key(path: str, key: Any, valid: Iterable[str]) -> ConfigError:
    """Return the error for an unknown mapping key, suggesting the closest valid name."""
    names = sorted(valid)
    where = f"{path}.{key}" if path else str(key)
    close = _closest(key, names)
    hint = f"did you mean {close}?" if close else f"valid keys: {', '.join(names)}"
    if isinstance(key, bool):  # the text as written is gone once YAML read it
        problem = f"unknown key, a boolean: {YAML_BOOLEANS}"
        return ConfigError(
            where, problem, allowed=f"quote the key, or give the setting's name: {hint}"
        )
    return ConfigError(where, "unknown key", allowed=hint)


def choices_hint(value: Any, choices: Iterable[str], verb: str = "choose one of") -> str:
    """Return how to fix a value that is not one of `choices`: the closest choice first, when one
    is close (`did you mean master? choose one of single, master, worker`), then all of them.
    """
    names = list(choices)
    close = _closest(value, names)
    every = f"{verb} {', '.join(names)}"
    return f"did you mean {close}? {every}" if close else every


def _closest(word: Any, names: Iterable[str]) -> str | None:
    """Return the name closest to `word` ignoring case (difflib finds nothing alike in `RUN` and
    `run`), or None when none is close.
    """
    lowered = {name.lower(): name for name in names}
    close = difflib.get_close_matches(str(word).lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[close[0]] if close else None


def on_every_rank(error: _Error) -> _Error:
    """Mark `error` as raised alike on every rank of a data-parallel group (decided after the
    ranks agreed, or from what they all read) and return it: rank 0 reports it for the group.
    """
    setattr(error, _EVERY_RANK, True)
    return error


def first_refusal(refusals: list[Any]) -> tuple[Any, str] | None:
    """Of each rank's gathered refusal (None where that rank found nothing wrong), return the first
    and the words naming the ranks that refused ("on rank 1, "; "" when every rank did), or None.
    """
    refused = [rank for rank, found in enumerate(refusals) if found is not None]
    if not refused:
        return None
    where = f"on rank {', '.join(map(str, refused))}, " if len(refused) < len(refusals) else ""
    return refusals[refused[0]], where


def describe_ranks(values: list[Any]) -> str:
    """Return which rank holds which value, for an error about ranks that disagree: values in
    order of first appearance, e.g. "bf16 on rank 0, 2; fp32 on rank 1".
    """
    ranks: dict[str, list[str]] = {}
    for rank, value in enumerate(values):
        ranks.setdefault(str(value), []).append(str(rank))
    return "; ".join(f"{value} on rank {', '.join(owners)}" for value, owners in ranks.items())


def raised_on_every_rank(error: BaseException) -> bool:
    """Return True for an error marked by on_every_rank."""
    return getattr(error, _EVERY_RANK, False)
