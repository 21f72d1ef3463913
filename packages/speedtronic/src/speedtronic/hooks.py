"""2.0 import path `speedtronic.hooks`: speedtronic_trainer's hook helpers."""

from __future__ import annotations

from speedtronic_trainer.hooks import on_event

__all__ = [
    "on_event",
]
