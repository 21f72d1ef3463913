"""DumbDiLoCo for Speedtronic: low-communication training over the Hugging Face Hub or a shared
folder.

Names resolve lazily, so `import speedtronic_diloco` (or running its stdlib-only test Hub server)
does not pay for torch and huggingface_hub until they are used.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from speedtronic_diloco.__about__ import __version__

_EXPORTS = {
    "DeltaUploadJob": "diloco",
    "DumbDiLoCoCoordinator": "diloco",
    "SyncResult": "diloco",
    "GlobalMetadata": "hub",
    "HubClient": "hub",
    "HubCorrupt": "hub",
    "HubError": "hub",
    "HubRefused": "hub",
    "HubUnavailable": "hub",
    "build_hub_client": "hub",
    "MasterOuterLoop": "outer",
    "NesterovOuterOptimizer": "outer",
    "NodeGroup": "group",
    "NodeRankError": "group",
    "NodeIdentity": "identity",
    "resolve_identity": "identity",
    "average_deltas": "tensors",
    "compute_pseudo_gradient": "tensors",
    "load_delta": "tensors",
    "load_safetensors": "tensors",
    "save_safetensors": "tensors",
    "FilesystemTransport": "transport",
    "HfApiTransport": "transport",
    "Transport": "transport",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    """Import the module that defines name on first use."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'speedtronic_diloco' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
