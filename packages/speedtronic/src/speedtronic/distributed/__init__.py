"""2.0 import path `speedtronic.distributed`: the DumbDiLoCo API of speedtronic_diloco and its
2.0 aliases.
"""

from __future__ import annotations

from speedtronic.distributed.diloco import (
    DeltaUploadJob,
    DumbDiLoCo,
    DumbDiLoCoCoordinator,
    SyncResult,
)
from speedtronic.distributed.hub import (
    GlobalMetadata,
    HubClient,
    HubError,
    HubTransport,
    HubUnavailable,
)
from speedtronic_diloco.outer import MasterOuterLoop, NesterovOuterOptimizer
from speedtronic_diloco.tensors import (
    average_deltas,
    compute_pseudo_gradient,
    load_delta,
    load_safetensors,
    save_safetensors,
)

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
