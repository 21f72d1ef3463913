"""speedtronic-systems: device and precision resolution, startup shape checks, CUDA stage streams,
the CPU allocator setting, atomic torch.save, the causal LM loss, a module's
gradient-checkpointing switch and eval mode that gives each submodule its own mode back.
"""

from __future__ import annotations

from speedtronic_systems.__about__ import __version__
from speedtronic_systems.atomic import atomic_torch_save
from speedtronic_systems.checkpointing import gradient_checkpointing_switch
from speedtronic_systems.compile_choice import resolve_compile
from speedtronic_systems.cpu_allocator import apply_cpu_allocator, resolve_cpu_allocator
from speedtronic_systems.loss import IGNORE_INDEX, causal_lm_loss
from speedtronic_systems.memory import (
    MemoryEstimate,
    check_training_memory,
    estimate_training_memory,
)
from speedtronic_systems.modes import switch_to_eval
from speedtronic_systems.precision import (
    DeviceError,
    PrecisionError,
    PrecisionPlan,
    agree_precision,
    autocast_context,
    available_devices,
    cpu_bf16_supported,
    datasheet_peak_flops,
    device_peak_flops,
    make_grad_scaler,
    parameter_count,
    resolve_device,
    resolve_precision,
    supports_fused_adamw,
)
from speedtronic_systems.scheduling import StageInfo, StageStreamScheduler
from speedtronic_systems.shapes import (
    ShapeProfile,
    ShapeReport,
    ShapeWarning,
    resolve_shape_profile,
    validate_startup_shapes,
)

__all__ = [
    "IGNORE_INDEX",
    "DeviceError",
    "MemoryEstimate",
    "PrecisionError",
    "PrecisionPlan",
    "ShapeProfile",
    "ShapeReport",
    "ShapeWarning",
    "StageInfo",
    "StageStreamScheduler",
    "__version__",
    "agree_precision",
    "apply_cpu_allocator",
    "atomic_torch_save",
    "autocast_context",
    "available_devices",
    "causal_lm_loss",
    "check_training_memory",
    "cpu_bf16_supported",
    "datasheet_peak_flops",
    "device_peak_flops",
    "estimate_training_memory",
    "gradient_checkpointing_switch",
    "make_grad_scaler",
    "parameter_count",
    "resolve_compile",
    "resolve_cpu_allocator",
    "resolve_device",
    "resolve_precision",
    "resolve_shape_profile",
    "supports_fused_adamw",
    "switch_to_eval",
    "validate_startup_shapes",
]
