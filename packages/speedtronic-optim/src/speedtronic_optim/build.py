"""Build the configured optimizer from a duck-typed optimizer config section."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from speedtronic_optim.adamw import make_adamw
from speedtronic_optim.cautious import CautiousOptimizer
from speedtronic_optim.hybrid import HybridOptimizer
from speedtronic_optim.routing import route_parameters

OPTIMIZER_NAMES = ("adamw", "muon")


def _field(section: Any, name: str, default: Any) -> Any:
    return getattr(section, name, default)


def build_optimizer(
    model: nn.Module, optimizer_section: Any, device: torch.device | str | None = None
) -> Optimizer:
    """Return AdamW (fused probed) or hybrid Muon/AdamW (``name: muon``), cautious when asked.

    ``optimizer_section`` is any object with the OptimizerConfig fields (name, lr, betas, eps,
    weight_decay, fused, muon_plus, cautious, muon_momentum, muon_ns_steps, muon_norm_eps).
    ``device`` is accepted for the 2.0 signature; parameters already live where the model does.
    """
    name = str(_field(optimizer_section, "name", "adamw")).lower()
    if name not in OPTIMIZER_NAMES:
        raise ValueError(
            f"optimizer.name = {name!r} is not supported; use one of {OPTIMIZER_NAMES}"
        )
    muon_plus = bool(_field(optimizer_section, "muon_plus", False))
    if muon_plus and name != "muon":
        raise ValueError("optimizer.muon_plus = true requires optimizer.name = 'muon'")
    lr = float(_field(optimizer_section, "lr", 3e-4))
    betas = tuple(_field(optimizer_section, "betas", (0.9, 0.95)))
    eps = float(_field(optimizer_section, "eps", 1e-8))
    weight_decay = float(_field(optimizer_section, "weight_decay", 0.1))
    fused = _field(optimizer_section, "fused", None)
    if name == "adamw":
        params = [param for param in model.parameters() if param.requires_grad]
        if not params:
            raise ValueError("the model has no trainable parameters to optimize")
        optimizer: Optimizer = make_adamw(
            params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused
        )
    else:
        routing = route_parameters(model)
        optimizer = HybridOptimizer(
            routing.muon,
            routing.adamw,
            muon_lr=lr,
            adamw_lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            fused=fused,
            muon_momentum=float(_field(optimizer_section, "muon_momentum", 0.95)),
            muon_ns_steps=int(_field(optimizer_section, "muon_ns_steps", 5)),
            muon_norm_eps=float(_field(optimizer_section, "muon_norm_eps", 1e-8)),
            muon_plus=muon_plus,
        )
    if bool(_field(optimizer_section, "cautious", False)):
        optimizer = CautiousOptimizer(optimizer)
    return optimizer


def build_v2_optimizer(
    model: nn.Module, config: Any, device: torch.device | str | None = None
) -> Optimizer:
    """2.0 name: build from a whole config (its ``optimizer``) or from the section itself."""
    return build_optimizer(model, getattr(config, "optimizer", config), device)
