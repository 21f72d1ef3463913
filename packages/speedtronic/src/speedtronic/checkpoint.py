"""2.0 import path `speedtronic.checkpoint`: speedtronic_trainer's checkpoints and
speedtronic_systems' atomic writes.
"""

from __future__ import annotations

from speedtronic_config.atomic import atomic_json_dump
from speedtronic_systems.atomic import atomic_torch_save
from speedtronic_trainer.checkpoint import (
    CheckpointError,
    CheckpointManager,
    capture_rng_state,
    restore_rng_state,
)

__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "atomic_json_dump",
    "atomic_torch_save",
    "capture_rng_state",
    "restore_rng_state",
]
