"""AdamW construction with best-effort fused kernels."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def make_adamw(
    params: Iterable[torch.Tensor],
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    fused: bool | None = None,
) -> torch.optim.AdamW:
    """Return AdamW, fused when asked (True) or probed (None); regular AdamW if fused fails."""
    params = list(params)
    kwargs = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
    if fused is not False:
        try:
            return torch.optim.AdamW(params, fused=True, **kwargs)
        except (RuntimeError, ValueError, TypeError):
            # Fused kernels are missing for some devices/dtypes; the spec makes fused best-effort.
            pass
    return torch.optim.AdamW(params, **kwargs)
