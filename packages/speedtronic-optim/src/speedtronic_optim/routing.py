"""Role-aware routing of a model's parameters to Muon or AdamW."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from speedtronic_optim.checks import check_model

ROLE_ATTRIBUTE = "_speedtronic_optimizer_role"
ROLES = ("muon", "adamw")
_HEAD_NAMES = ("lm_head", "head", "output", "embed", "wte", "wpe", "classifier", "unembed")


@dataclass
class ParameterRouting:
    """Deterministic parameter ownership for the hybrid optimizer."""

    muon: list[torch.Tensor] = field(default_factory=list)
    adamw: list[torch.Tensor] = field(default_factory=list)
    skipped: list[torch.Tensor] = field(default_factory=list)
    muon_names: list[str] = field(default_factory=list)
    adamw_names: list[str] = field(default_factory=list)
    skipped_names: list[str] = field(default_factory=list)
    # The Muon matrices stored (in, out), as transformers' Conv1D stores them: transposed from
    # nn.Linear's (out, in), which Muon's shape rules assume.
    transposed: list[torch.Tensor] = field(default_factory=list)

    def muon_param_groups(self) -> list[dict[str, Any]]:
        """Return Muon's parameter groups: the (out, in) matrices, then the ``transposed`` ones
        with ``transposed=True`` (empty groups left out), so ``Muon(routing.muon_param_groups())``
        treats a Conv1D weight as the nn.Linear weight it stands for.
        """
        flipped = {id(param) for param in self.transposed}
        groups = [
            {"params": [param for param in self.muon if id(param) not in flipped]},
            {"params": [param for param in self.muon if id(param) in flipped], "transposed": True},
        ]
        return [group for group in groups if group["params"]]


def _is_embedding_or_head(name: str, module: nn.Module) -> bool:
    if isinstance(module, nn.Embedding | nn.EmbeddingBag):
        return True
    leaf = name.rsplit(".", 1)[-1].lower()
    return any(leaf == key or leaf.startswith(key) for key in _HEAD_NAMES)


def _is_conv1d(module: nn.Module) -> bool:
    """Return True for transformers' Conv1D (GPT-2's projections: a linear layer whose weight is
    stored as (in, out)), recognized by class without importing transformers.
    """
    return any(
        cls.__name__ == "Conv1D" and cls.__module__.startswith("transformers.")
        for cls in type(module).__mro__
    )


def _is_linear(module: nn.Module) -> bool:
    """Return True for nn.Linear and for transformers' Conv1D."""
    return isinstance(module, nn.Linear) or _is_conv1d(module)


def _role_override(module: nn.Module, qualified: str) -> str | None:
    role = getattr(module, ROLE_ATTRIBUTE, None)
    if role is not None and role not in ROLES:
        raise ValueError(f"{qualified}.{ROLE_ATTRIBUTE} = {role!r}; use 'muon' or 'adamw'")
    return role


def route_parameters(model: nn.Module) -> ParameterRouting:
    """Route hidden linear weights to Muon, other trainable tensors to AdamW; skip frozen ones.

    Linear: nn.Linear, and transformers' Conv1D (GPT-2's projections), whose weights are also
    listed in ``transposed``: give Muon ``muon_param_groups()``, which marks them, not ``muon``.

    Each parameter appears once even when tied (its first owner decides; a tie with an embedding
    always sends it to AdamW). ``module._speedtronic_optimizer_role = "muon" | "adamw"`` overrides
    (a "muon" module's ``bias`` stays on AdamW).
    """
    check_model("route_parameters model", model)
    routing = ParameterRouting()
    roles: dict[int, str] = {}
    flipped: set[int] = set()  # ids of weights stored (in, out)
    order: list[tuple[str, torch.Tensor]] = []
    for module_name, module in model.named_modules():
        override = _role_override(module, module_name or "<root>")
        for param_name, param in module.named_parameters(recurse=False):
            qualified = f"{module_name}.{param_name}" if module_name else param_name
            if not param.requires_grad:
                if id(param) not in roles:
                    roles[id(param)] = "skipped"
                    order.append((qualified, param))
                continue
            if override == "muon" and param_name == "bias":
                # The module's matrix opts into Muon; its bias stays AdamW's, as every bias is.
                role = "adamw"
            elif override is not None:
                role = override
            elif (
                _is_linear(module)
                and param_name == "weight"
                and param.ndim == 2
                and not _is_embedding_or_head(module_name, module)
            ):
                role = "muon"
            else:
                role = "adamw"
            if id(param) not in roles:
                roles[id(param)] = role
                order.append((qualified, param))
                if _is_conv1d(module) and param_name == "weight":
                    flipped.add(id(param))
            elif role == "adamw" and override is None and roles[id(param)] == "muon":
                # A head tied to an embedding is an embedding: never orthogonalize it.
                roles[id(param)] = "adamw"
    for qualified, param in order:
        role = roles[id(param)]
        if role == "muon" and param.ndim != 2:
            raise ValueError(
                f"{qualified} has shape {tuple(param.shape)} but is routed to Muon, which needs "
                "2-D matrices; "
                f"set {ROLE_ATTRIBUTE} = 'adamw' on its module"
            )
        getattr(routing, role).append(param)
        getattr(routing, f"{role}_names").append(qualified)
        if role == "muon" and id(param) in flipped:
            routing.transposed.append(param)
    return routing
