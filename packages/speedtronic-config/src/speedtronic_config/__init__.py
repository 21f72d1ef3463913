"""Speedtronic configuration: typed sections, validation and YAML I/O (never imports torch)."""

from __future__ import annotations

from speedtronic_config.__about__ import __version__
from speedtronic_config.config import SpeedtronicConfig, resolve_section
from speedtronic_config.errors import ConfigError
from speedtronic_config.overrides import apply_overrides
from speedtronic_config.sections import (
    HOOK_NAMES,
    CheckpointConfig,
    DataConfig,
    DistributedConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    PrecisionConfig,
    RunConfig,
    SchedulerConfig,
    ShapeValidationConfig,
)

__all__ = [
    "HOOK_NAMES",
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "DistributedConfig",
    "LoggingConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ParallelConfig",
    "PrecisionConfig",
    "RunConfig",
    "SchedulerConfig",
    "ShapeValidationConfig",
    "SpeedtronicConfig",
    "__version__",
    "apply_overrides",
    "resolve_section",
]
