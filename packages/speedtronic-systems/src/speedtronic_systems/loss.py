"""The causal language-model loss and its ignored-label convention, shared by models and trainer."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Label value that takes no part in the loss (padding, prompts): PyTorch's and Hugging Face's.
IGNORE_INDEX = -100


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Return the mean cross-entropy of (..., V) logits over labels != IGNORE_INDEX.

    Labels are already shifted (one next-token label per position), of any integer type. With
    every label ignored the loss is 0, not NaN. Computed in at least float32 (float64 logits stay
    float64): half-precision cross entropy loses accuracy for large vocabularies.
    """
    flat = logits.flatten(0, -2)
    targets = labels.flatten()
    if not targets.is_floating_point():
        # Token ids often arrive as int32 (numpy memmaps); cross_entropy takes int64 targets only.
        targets = targets.long()
    total = F.cross_entropy(
        flat.to(torch.promote_types(flat.dtype, torch.float32)),
        targets,
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    return total / (labels != IGNORE_INDEX).sum().clamp_min(1)


__all__ = ["IGNORE_INDEX", "causal_lm_loss"]
