"""2.0 import path `speedtronic.registry`: speedtronic_model's model registry."""

from __future__ import annotations

from speedtronic_model.registry import (
    ModelFactory,
    ModelRegistry,
    build_model,
    register_model,
    registry,
)

__all__ = [
    "ModelFactory",
    "ModelRegistry",
    "build_model",
    "register_model",
    "registry",
]
