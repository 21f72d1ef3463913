"""2.0 import path `speedtronic.distributed`: the DumbDiLoCo API of speedtronic_diloco and its
2.0 aliases.
"""

from __future__ import annotations

from speedtronic_diloco.diloco import DeltaUploadJob, DumbDiLoCoCoordinator, SyncResult
from speedtronic_diloco.hub import GlobalMetadata, HubClient, HubError, HubUnavailable
from speedtronic_diloco.outer import MasterOuterLoop, NesterovOuterOptimizer
from speedtronic_diloco.tensors import (
    average_deltas,
    compute_pseudo_gradient,
    load_delta,
    load_safetensors,
    save_safetensors,
)

DumbDiLoCo = DumbDiLoCoCoordinator
HubTransport = HubClient

__all__ = [
    "DeltaUploadJob",
    "DumbDiLoCo",
    "DumbDiLoCoCoordinator",
    "GlobalMetadata",
    "HubClient",
    "HubError",
    "HubTransport",
    "HubUnavailable",
    "MasterOuterLoop",
    "NesterovOuterOptimizer",
    "SyncResult",
    "average_deltas",
    "compute_pseudo_gradient",
    "load_delta",
    "load_safetensors",
    "save_safetensors",
]
