"""2.0 import path `speedtronic.precision`: speedtronic_systems' device and precision resolution."""

from __future__ import annotations

from speedtronic_systems.precision import (
    PrecisionPlan,
    autocast_context,
    make_grad_scaler,
    parameter_count,
    resolve_device,
    resolve_precision,
    supports_fused_adamw,
)

__all__ = [
    "PrecisionPlan",
    "autocast_context",
    "make_grad_scaler",
    "parameter_count",
    "resolve_device",
    "resolve_precision",
    "supports_fused_adamw",
]
