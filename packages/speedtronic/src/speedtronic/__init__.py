"""Speedtronic: fast, efficient training with optional DumbDiLoCo.

The 2.0 import surface over the speedtronic-* micro-packages. Names resolve lazily, on first
use, so `import speedtronic` (and `speedtronic validate`) never pays for torch.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

from speedtronic.__about__ import __version__

# public name -> the 2.0 module that hands it out
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(
        [
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
        ],
        "speedtronic.config",
    ),
    "set_gradient_checkpointing": "speedtronic.module_utils",
    **dict.fromkeys(
        [
            "CautiousOptimizer",
            "HybridOptimizer",
            "Muon",
            "ParameterRouting",
            "newton_schulz",
            "post_polar_normalize",
            "route_parameters",
        ],
        "speedtronic.optimizers",
    ),
    **dict.fromkeys(
        ["ModelRegistry", "build_model", "register_model", "registry"], "speedtronic.registry"
    ),
    **dict.fromkeys(["StageInfo", "StageStreamScheduler"], "speedtronic.scheduling"),
    **dict.fromkeys(
        [
            "ShapeProfile",
            "ShapeReport",
            "ShapeWarning",
            "resolve_shape_profile",
            "validate_startup_shapes",
        ],
        "speedtronic.shapes",
    ),
    **dict.fromkeys(["Trainer", "TrainResult", "SyncCoordinator"], "speedtronic.trainer"),
    "CheckpointManager": "speedtronic.checkpoint",
    "MetricLogger": "speedtronic.profiling",
    **dict.fromkeys(["build_runtime", "train_from_config"], "speedtronic.runtime"),
    "ReferenceTransformer": "speedtronic.model",
}

__all__ = sorted(_EXPORTS) + ["__version__"]

# 2.0 modules that are attributes of the package (2.0's `import speedtronic` imported several, so
# `speedtronic.config.load_config(...)` worked without importing the submodule). `registry` is
# the name of the ModelRegistry instance, as in 2.0.
_SUBMODULES = frozenset(
    [
        "checkpoint",
        "cli",
        "config",
        "data",
        "distributed",
        "hooks",
        "integrations",
        "model",
        "module_utils",
        "optimizers",
        "precision",
        "profiling",
        "runtime",
        "scheduling",
        "shapes",
        "trainer",
    ]
)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"speedtronic.{name}")  # the import binds it here
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'speedtronic' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolve once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | _SUBMODULES)


class _Package(types.ModuleType):
    """The package module: importing its submodule `registry` keeps `speedtronic.registry` the
    ModelRegistry instance, as 2.0 bound it (the import system sets the submodule on the package).
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "registry" and isinstance(value, types.ModuleType):
            value = value.registry
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
