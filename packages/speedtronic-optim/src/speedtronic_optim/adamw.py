"""AdamW construction with best-effort fused kernels."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from speedtronic_optim.checks import check_arguments, check_parameters

# Speedtronic's AdamW hyperparameters, written once: make_adamw and HybridOptimizer default to
# them and speedtronic-config's OptimizerConfig is tested to agree.
DEFAULT_LR = 3e-4
DEFAULT_BETAS = (0.9, 0.95)
DEFAULT_EPS = 1e-8
DEFAULT_WEIGHT_DECAY = 0.1


def make_adamw(
    params: Iterable[torch.Tensor],
    *,
    lr: float = DEFAULT_LR,
    betas: tuple[float, float] = DEFAULT_BETAS,
    eps: float = DEFAULT_EPS,
    weight_decay: float = DEFAULT_WEIGHT_DECAY,
    fused: bool | None = None,
) -> torch.optim.AdamW:
    """Return AdamW, fused when asked (True) or probed (None); regular AdamW if fused fails."""
    check_parameters("make_adamw params", params)
    check_arguments(
        "make_adamw", lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused
    )
    params = list(params)
    for index, group in enumerate(params):
        if isinstance(group, dict):  # a group's own options, checked as the arguments are
            own = {
                key: group[key] for key in ("lr", "betas", "eps", "weight_decay") if key in group
            }
            check_arguments(f"make_adamw param group {index}", **own)
    kwargs = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
    if fused is not False:
        try:
            return torch.optim.AdamW(params, fused=True, **kwargs)
        except (RuntimeError, ValueError, TypeError):
            # Fused kernels are missing for some devices/dtypes; fused is best-effort by design.
            pass
    return torch.optim.AdamW(params, **kwargs)
