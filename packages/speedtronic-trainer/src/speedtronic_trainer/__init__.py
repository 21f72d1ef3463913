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
from speedtronic_trainer.data_position import BatchStream
from speedtronic_trainer.hooks import on_event
from speedtronic_trainer.integrations import TensorboardHook, WandbHook, hooks_from_names
from speedtronic_trainer.profiling import (
    CallbackList,
    MetricLogger,
    TrainingHook,
    memory_usage_bytes,
)
from speedtronic_trainer.settings import TrainerSettings
from speedtronic_trainer.trainer import (
    NonFiniteLossError,
    SpeedtronicTrainer,
    SyncCoordinator,
    Trainer,
    TrainingEngine,
    TrainResult,
)

__all__ = [
    "BatchStream",
    "CallbackList",
    "CheckpointError",
    "CheckpointManager",
    "MetricLogger",
    "NonFiniteLossError",
    "SpeedtronicTrainer",
    "SyncCoordinator",
    "TensorboardHook",
    "TrainResult",
    "Trainer",
    "TrainerSettings",
    "TrainingEngine",
    "TrainingHook",
    "WandbHook",
    "__version__",
    "capture_rng_state",
    "hooks_from_names",
    "memory_usage_bytes",
    "on_event",
    "restore_rng_state",
]
