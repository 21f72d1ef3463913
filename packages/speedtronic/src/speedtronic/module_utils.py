"""2.0 import path `speedtronic.module_utils`: speedtronic_model's module helpers."""

from __future__ import annotations

from speedtronic_model.module_utils import set_gradient_checkpointing

__all__ = [
    "set_gradient_checkpointing",
]
