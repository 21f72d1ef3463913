"""Speedtronic's reference transformer, model registry and module helpers.

Names resolve lazily (module __getattr__): the registry and module_utils never import torch,
so `import speedtronic_model` stays cheap until a model is actually built.
"""

from __future__ import annotations

import importlib
from typing import Any

from speedtronic_model.__about__ import __version__

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(
        [
            "CausalSelfAttention",
            "GPTConfig",
            "KVCache",
            "RMSNorm",
            "ReferenceTransformer",
            "RotaryEmbedding",
            "SwiGLU",
            "TransformerBlock",
            "apply_rope",
        ],
        "speedtronic_model.model",
    ),
    **dict.fromkeys(
        ["ModelFactory", "ModelRegistry", "build_model", "register_model"],
        "speedtronic_model.registry",
    ),
    **dict.fromkeys(
        ["apply_init_from", "llama_config", "load_llama", "save_llama"],
        "speedtronic_model.hf_llama",
    ),
    **dict.fromkeys(
        ["GradientCheckpointingWarning", "set_gradient_checkpointing"],
        "speedtronic_model.module_utils",
    ),
}


def __getattr__(name: str) -> Any:
    """Import the module that defines name on first access."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'speedtronic_model' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = ["__version__", *sorted(_EXPORTS)]
