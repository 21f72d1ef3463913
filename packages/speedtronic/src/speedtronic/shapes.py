"""2.0 import path `speedtronic.shapes`: speedtronic_systems' startup shape checks."""

from __future__ import annotations

from speedtronic_systems.shapes import (
    ShapeProfile,
    ShapeReport,
    ShapeWarning,
    resolve_shape_profile,
    validate_startup_shapes,
)

__all__ = [
    "ShapeProfile",
    "ShapeReport",
    "ShapeWarning",
    "resolve_shape_profile",
    "validate_startup_shapes",
]
