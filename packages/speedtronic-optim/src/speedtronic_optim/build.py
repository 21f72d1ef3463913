"""Build the configured optimizer from a duck-typed optimizer section."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from speedtronic_optim.adamw import make_adamw
from speedtronic_optim.cautious import CautiousOptimizer
from speedtronic_optim.hybrid import HybridOptimizer
from speedtronic_optim.routing import route_parameters

# Section field -> keyword of the constructor it feeds. A field the section lacks is not passed,
# so the constructor's own default applies: the constructors are the one source of defaults.
_ADAMW_FIELDS = {"lr": "lr", "betas": "betas", "eps": "eps", "weight_decay": "weight_decay"}
_HYBRID_FIELDS = {
    "betas": "betas",
    "eps": "eps",
    "weight_decay": "weight_decay",
    "muon_momentum": "muon_momentum",
    "muon_ns_steps": "muon_ns_steps",
    "muon_norm_eps": "muon_norm_eps",
    "muon_plus": "muon_plus",
}


def _given(section: Any, names: dict[str, str]) -> dict[str, Any]:
    return {
        kw: getattr(section, f) for f, kw in names.items() if getattr(section, f, None) is not None
    }


def build_optimizer(
    model: nn.Module,
    optimizer_section: Any,
    device: torch.device | str | None = None,
    *,
    distributed: bool | None = None,
    process_group: Any = None,
) -> Optimizer:
    """Return AdamW (fused probed) or hybrid Muon/AdamW (``name: muon``), cautious when asked.

    ``optimizer_section`` is any object with a ``name`` (adamw or muon) and any of the
    OptimizerConfig fields (lr, betas, eps, weight_decay, fused, muon_plus, cautious,
    muon_momentum, muon_ns_steps, muon_norm_eps, adamw_lr: the rate of Muon's AdamW branch, `lr`
    when unset); speedtronic-config validates them. ``device``
    is accepted for the 2.0 signature; parameters already live where the model does.
    ``distributed`` and ``process_group`` go to Muon: True when the model is a DDP or FSDP2
    replica in `process_group` (default: the world), so Newton–Schulz is split over its ranks.
    """
    name = getattr(optimizer_section, "name", None)
    fused = {"fused": optimizer_section.fused} if hasattr(optimizer_section, "fused") else {}
    if name == "adamw":
        params = [param for param in model.parameters() if param.requires_grad]
        if not params:
            raise ValueError("the model has no trainable parameters to optimize")
        optimizer: Optimizer = make_adamw(
            params, **_given(optimizer_section, _ADAMW_FIELDS), **fused
        )
    elif name == "muon":
        routing = route_parameters(model)
        lr = getattr(optimizer_section, "lr", None)
        rates = {} if lr is None else {"muon_lr": lr, "adamw_lr": lr}
        if getattr(optimizer_section, "adamw_lr", None) is not None:
            rates["adamw_lr"] = optimizer_section.adamw_lr
        optimizer = HybridOptimizer(
            routing.muon,
            routing.adamw,
            **rates,
            **_given(optimizer_section, _HYBRID_FIELDS),
            **fused,
            muon_distributed=distributed,
            muon_process_group=process_group,
        )
    else:
        raise ValueError(f"optimizer name {name!r} is not supported; use 'adamw' or 'muon'")
    if getattr(optimizer_section, "cautious", False):
        optimizer = CautiousOptimizer(optimizer)
    return optimizer


__all__ = ["build_optimizer"]
