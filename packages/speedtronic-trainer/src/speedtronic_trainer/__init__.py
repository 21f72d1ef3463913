"""Speedtronic trainer: the training loop, checkpoints, exact resume, metrics and logging
integrations.
"""

from __future__ import annotations

from speedtronic_trainer.__about__ import __version__
from speedtronic_trainer.checkpoint import (
    CheckpointError,
    CheckpointManager,
    capture_rng_state,
    restore_rng_state,
)
from speedtronic_trainer.checkpoint_checks import CheckpointMismatch
from speedtronic_trainer.data_position import BatchStream
from speedtronic_trainer.hooks import CallbackList, TrainingHook, on_event
from speedtronic_trainer.integrations import TensorboardHook, WandbHook, hooks_from_names
from speedtronic_trainer.metric_logger import MetricLogger
from speedtronic_trainer.metrics import memory_usage_bytes
from speedtronic_trainer.trainer import (
    NonFiniteLossError,
    StepOutcome,
    SyncCoordinator,
    Trainer,
    TrainResult,
)

__all__ = [
    "BatchStream",
    "CallbackList",
    "CheckpointError",
    "CheckpointManager",
    "CheckpointMismatch",
    "MetricLogger",
    "NonFiniteLossError",
    "StepOutcome",
    "SyncCoordinator",
    "TensorboardHook",
    "TrainResult",
    "Trainer",
    "TrainingHook",
    "WandbHook",
    "__version__",
    "capture_rng_state",
    "hooks_from_names",
    "memory_usage_bytes",
    "on_event",
    "restore_rng_state",
]
