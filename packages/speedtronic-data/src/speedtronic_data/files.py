"""Atomic text writes for the small JSON files beside shards and exports."""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write text (UTF-8) to path through a temporary file, fsync and rename; return the path."""
    path = Path(path)
    # Created by open(), not mkstemp, so the file gets the usual umask permissions, not 0600.
    tmp = path.with_name(f".{path.name}.{os.urandom(6).hex()}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


__all__ = ["write_text_atomic"]
