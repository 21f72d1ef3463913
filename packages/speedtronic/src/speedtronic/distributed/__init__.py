"""2.0 import path `speedtronic.distributed`: the DumbDiLoCo API of speedtronic_diloco and its
2.0 aliases. Imported through the 2.0 submodules, so that (as in 2.0) each of them, `.tensors`
included, is an attribute of this package.
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
from speedtronic.distributed.outer import MasterOuterLoop, NesterovOuterOptimizer
from speedtronic.distributed.tensors import (
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
