"""2.0 import path `speedtronic.scheduling`: speedtronic_systems' CUDA stage streams."""

from __future__ import annotations

from speedtronic_systems.scheduling import StageInfo, StageStreamScheduler

__all__ = [
    "StageInfo",
    "StageStreamScheduler",
]
