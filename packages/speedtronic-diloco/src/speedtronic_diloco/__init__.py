"""DumbDiLoCo for Speedtronic: low-communication training over the Hugging Face Hub or a shared folder."""

from __future__ import annotations

from .__about__ import __version__
from .hub import GlobalMetadata, HubClient, HubError, HubTransport, HubUnavailable, build_hub_client
from .outer import MasterOuterLoop, NesterovOuterOptimizer
from .tensors import average_deltas, compute_pseudo_gradient, load_delta, load_safetensors, save_safetensors
from .transport import FilesystemTransport, HfApiTransport, Transport

__all__ = [
    "FilesystemTransport", "GlobalMetadata", "HfApiTransport", "HubClient", "HubError", "HubTransport",
    "HubUnavailable", "MasterOuterLoop", "NesterovOuterOptimizer", "Transport", "__version__", "average_deltas",
    "build_hub_client", "compute_pseudo_gradient", "load_delta", "load_safetensors", "save_safetensors",
]
