"""2.0 import path `speedtronic.model`: the reference transformer of speedtronic_model and its
2.0 aliases.
"""

from __future__ import annotations

from speedtronic_model.model import (
    CausalSelfAttention,
    GPTConfig,
    ReferenceTransformer,
    RMSNorm,
    RotaryEmbedding,
    SwiGLU,
    TransformerBlock,
    apply_rope,
)

GPT = ReferenceTransformer
Transformer = ReferenceTransformer
ReferenceModel = ReferenceTransformer
GPTModel = ReferenceTransformer
TransformerConfig = GPTConfig

__all__ = [
    "CausalSelfAttention",
    "GPT",
    "GPTConfig",
    "GPTModel",
    "RMSNorm",
    "ReferenceModel",
    "ReferenceTransformer",
    "RotaryEmbedding",
    "SwiGLU",
    "Transformer",
    "TransformerBlock",
    "TransformerConfig",
    "apply_rope",
]
