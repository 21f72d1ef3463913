"""Build the configured optimizer from a duck-typed optimizer section."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from speedtronic_optim.adamw import make_adamw
from speedtronic_optim.cautious import CautiousOptimizer
from speedtronic_optim.checks import as_section, check_arguments, check_model
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

# Every OptimizerConfig field: those read here, and grad_clip, which the trainer reads.
_SECTION_FIELDS = frozenset(
    {"name", "lr", "adamw_lr", "fused", "cautious", "grad_clip", *_ADAMW_FIELDS, *_HYBRID_FIELDS}
)


def _given(section: Any, names: dict[str, str]) -> dict[str, Any]:
    """Return the fields of ``names`` the section sets (not None), checked, by keyword."""
    given = {f: getattr(section, f) for f in names if getattr(section, f, None) is not None}
    check_arguments("optimizer section", **given)
    return {names[f]: value for f, value in given.items()}


def build_optimizer(
    model: nn.Module,
    optimizer_section: Any,
    device: torch.device | str | None = None,
    *,
    distributed: bool | None = None,
    process_group: Any = None,
) -> Optimizer:
    """Return AdamW (fused probed) or hybrid Muon/AdamW (``name: muon``), cautious when asked.

    ``optimizer_section`` is any object (or mapping, refused with a key of no such field; or a
    bare name) with a ``name`` (adamw or muon) and any of the OptimizerConfig fields (lr, betas,
    eps, weight_decay, fused, muon_plus, cautious, muon_momentum, muon_ns_steps, muon_norm_eps,
    adamw_lr: the rate of Muon's AdamW branch, `lr` when unset); a field of the wrong type or
    range raises naming it. ``device`` is accepted for the 2.0 signature; parameters already live
    where the model does. ``distributed`` and ``process_group`` go to Muon: True when the model
    is a DDP or FSDP2 replica in `process_group` (default: the world), so Newton–Schulz is split
    over its ranks.
    """
    check_model("build_optimizer model", model)
    section = as_section(optimizer_section, "optimizer section", _SECTION_FIELDS)
    name = getattr(section, "name", None)
    if name not in ("adamw", "muon"):
        raise ValueError(f"optimizer name {name!r} is not supported; use 'adamw' or 'muon'")
    # A section's fused (None included) always reaches the constructor, as in 2.0.
    fused = {"fused": section.fused} if hasattr(section, "fused") else {}
    check_arguments("optimizer section", **fused)
    if name == "adamw":
        params = [param for param in model.parameters() if param.requires_grad]
        if not params:
            raise ValueError("the model has no trainable parameters to optimize")
        optimizer: Optimizer = make_adamw(params, **_given(section, _ADAMW_FIELDS), **fused)
    else:
        routing = route_parameters(model)
        rates = _given(section, {"lr": "muon_lr", "adamw_lr": "adamw_lr"})
        if "muon_lr" in rates:  # an unset adamw_lr: the AdamW branch runs at lr, as in 2.0
            rates.setdefault("adamw_lr", rates["muon_lr"])
        optimizer = HybridOptimizer(
            routing.muon_param_groups(),
            routing.adamw,
            **rates,
            **_given(section, _HYBRID_FIELDS),
            **fused,
            muon_distributed=distributed,
            muon_process_group=process_group,
        )
    if _given(section, {"cautious": "cautious"}).get("cautious", False):
        optimizer = CautiousOptimizer(optimizer)
    return optimizer


__all__ = ["build_optimizer"]
