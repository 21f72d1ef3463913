"""2.0 import path `speedtronic.profiling`: speedtronic_trainer's metric logger and hooks, and
the 2.0 type names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from speedtronic_trainer.hooks import CallbackList, TrainingHook
from speedtronic_trainer.metric_logger import MetricLogger
from speedtronic_trainer.metrics import memory_usage_bytes

Metric = dict[str, Any]
Hook = Callable[[str, Metric], None]

__all__ = [
    "CallbackList",
    "Hook",
    "Metric",
    "MetricLogger",
    "TrainingHook",
    "memory_usage_bytes",
]
