"""2.0 import path `speedtronic.optimizers`: speedtronic_optim's optimizers and the 2.0
builder name.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from speedtronic_optim import (
    CautiousOptimizer,
    HybridOptimizer,
    Muon,
    ParameterRouting,
    build_optimizer,
    newton_schulz,
    post_polar_normalize,
    route_parameters,
)


def build_v2_optimizer(
    model: nn.Module, config: Any, device: torch.device, *, distributed: bool | None = None
) -> Optimizer:
    """Build AdamW, hybrid Muon/AdamW or a cautious variant from a config (or its optimizer).

    ``distributed=True``: the model is data-parallel (DDP or FSDP2) over the world group, and
    Muon splits its Newton–Schulz over the ranks.
    """
    section = getattr(config, "optimizer", config)
    return build_optimizer(model, section, device, distributed=distributed)


__all__ = [
    "CautiousOptimizer",
    "HybridOptimizer",
    "Muon",
    "ParameterRouting",
    "build_v2_optimizer",
    "newton_schulz",
    "post_polar_normalize",
    "route_parameters",
]
