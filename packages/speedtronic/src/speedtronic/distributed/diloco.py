"""2.0 import path `speedtronic.distributed.diloco`: speedtronic_diloco's coordinator and its
2.0 alias.
"""

from __future__ import annotations

from speedtronic_diloco.diloco import (
    LOGGER,
    DeltaUploadJob,
    DumbDiLoCoCoordinator,
    GlobalCandidate,
    SyncResult,
)

DumbDiLoCo = DumbDiLoCoCoordinator

__all__ = [
    "DeltaUploadJob",
    "DumbDiLoCo",
    "DumbDiLoCoCoordinator",
    "GlobalCandidate",
    "LOGGER",
    "SyncResult",
]
