"""2.0 import path `speedtronic.integrations`: speedtronic_trainer's TensorBoard and W&B hooks."""

from __future__ import annotations

from speedtronic_trainer.integrations import TensorboardHook, WandbHook

__all__ = [
    "TensorboardHook",
    "WandbHook",
]
