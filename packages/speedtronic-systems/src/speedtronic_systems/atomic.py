"""torch.save through speedtronic-config's atomic file writes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from speedtronic_config import atomic


def atomic_torch_save(state: Any, path: str | os.PathLike[str]) -> Path:
    """torch.save `state` to `path` atomically; return the path."""
    # Through the module: a fault injected into atomic.atomic_write reaches checkpoints too.
    return atomic.atomic_write(path, lambda handle: torch.save(state, handle))


__all__ = ["atomic_torch_save"]
