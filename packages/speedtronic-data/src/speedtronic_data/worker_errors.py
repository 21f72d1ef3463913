"""An error a DataLoader worker raised, given back as the worker raised it."""

from __future__ import annotations

import ast
import pathlib
import re

# torch re-raises a worker's error in the main process as the same type, its message this header
# and the worker's whole traceback: a one-line report of it named the worker, not the fault.
_HEADER = re.compile(r"Caught (\w+) in DataLoader worker process \d+\.")
# OSError's message: "[Errno 2] No such file or directory: '/path'", the file name as its repr:
# a string's or bytes', a path's (PosixPath('/path')) or a file descriptor's (7).
_OS_ERROR = re.compile(r"\[Errno (\d+)\] (.*?)(?:: ((?:\w+Path\()?b?['\"].*|\d+))?", re.S)
_PATH = re.compile(r"(\w+Path)\((.*)\)", re.S)


def worker_original(error: Exception) -> Exception | None:
    """Return the error a DataLoader worker raised, rebuilt from torch's copy of it (`error`);
    None when `error` is no such copy or its type cannot be rebuilt from a message alone.
    """
    message = str(error)
    header = _HEADER.match(message)
    kind = type(error)
    # torch raises RuntimeError when the type takes no message, and quotes a KeyError's.
    if header is None or header.group(1) != kind.__name__ or issubclass(kind, KeyError):
        return None
    module = kind.__module__
    name = (
        kind.__qualname__ if module in ("builtins", "__main__") else f"{module}.{kind.__qualname__}"
    )
    # A traceback ends with "module.Name: message" (traceback.format_exception's last line).
    marker = f"\n{name}: "
    at = message.rfind(marker)
    if at < 0:
        return None
    try:
        return _rebuild(kind, message[at + len(marker) :].rstrip("\n"))
    except Exception:  # a type whose constructor wants more than the message
        return None


def _rebuild(kind: type[Exception], message: str) -> Exception:
    """Return `kind` built from its message; an OSError with its errno and file name, so that
    `error.errno` and `error.filename` read as the worker's did.
    """
    parts = _OS_ERROR.fullmatch(message) if issubclass(kind, OSError) else None
    if parts is not None:
        number, reason, filename = parts.groups()
        try:
            name = () if filename is None else (_filename(filename),)
            rebuilt = kind(int(number), reason, *name)
        # Not one repr ("'a' -> 'b'", a rename's two names), or a subclass whose constructor
        # takes the message alone (one made from an OSError's text).
        except (ValueError, SyntaxError, TypeError):
            rebuilt = None
        if rebuilt is not None and str(rebuilt) == message:
            return rebuilt
    return kind(message)


def _filename(text: str) -> str | bytes | int | pathlib.PurePath:
    """Return the file name whose repr is `text` (ValueError or SyntaxError when it is none)."""
    path = _PATH.fullmatch(text)
    if path is None:
        return ast.literal_eval(text)
    kind = getattr(pathlib, path.group(1), None)
    if not (isinstance(kind, type) and issubclass(kind, pathlib.PurePath)):
        raise ValueError(f"{path.group(1)} is not a pathlib type")
    return kind(ast.literal_eval(path.group(2)))


__all__ = ["worker_original"]
