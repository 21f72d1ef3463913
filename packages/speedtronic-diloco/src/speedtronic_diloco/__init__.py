"""DumbDiLoCo for Speedtronic: low-communication training over the Hugging Face Hub or a shared folder."""

from __future__ import annotations

from .__about__ import __version__
from .diloco import DeltaUploadJob, DumbDiLoCo, DumbDiLoCoCoordinator, SyncResult
from .hub import GlobalMetadata, HubClient, HubError, HubTransport, HubUnavailable, build_hub_client
from .outer import MasterOuterLoop, NesterovOuterOptimizer
from .settings import DistributedSettings
from .tensors import average_deltas, compute_pseudo_gradient, load_delta, load_safetensors, save_safetensors
from .transport import FilesystemTransport, HfApiTransport, Transport

__all__ = [
    "DeltaUploadJob", "DumbDiLoCo", "DumbDiLoCoCoordinator", "SyncResult", "FilesystemTransport", "GlobalMetadata", "HfApiTransport", "HubClient", "HubError", "HubTransport",
    "HubUnavailable", "MasterOuterLoop", "NesterovOuterOptimizer", "Transport", "__version__", "average_deltas",
    "build_hub_client", "DistributedSettings", "compute_pseudo_gradient", "load_delta", "load_safetensors", "save_safetensors",
]
