"""2.0 import path `speedtronic.config`: speedtronic_config's objects and the 2.0 loader names."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from speedtronic_config import (
    CheckpointConfig,
    ConfigError,
    DataConfig,
    DistributedConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    PrecisionConfig,
    RunConfig,
    SchedulerConfig,
    ShapeValidationConfig,
    SpeedtronicConfig,
)

Config = SpeedtronicConfig


def load_config(source: str | os.PathLike[str] | Mapping[str, Any]) -> SpeedtronicConfig:
    """Return a validated config from a mapping, a file path, or inline YAML/JSON text."""
    return SpeedtronicConfig.load(source)


def load_yaml_config(path: str | os.PathLike[str]) -> SpeedtronicConfig:
    """Return a validated config from a YAML (or JSON) file."""
    return SpeedtronicConfig.from_yaml(path)


__all__ = [
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "DistributedConfig",
    "LoggingConfig",
    "ModelConfig",
    "OptimizerConfig",
    "PrecisionConfig",
    "RunConfig",
    "SchedulerConfig",
    "ShapeValidationConfig",
    "SpeedtronicConfig",
    "load_config",
    "load_yaml_config",
]
