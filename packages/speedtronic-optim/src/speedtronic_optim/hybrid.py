"""One optimizer facade over Muon (hidden matrices) and AdamW (everything else)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.optim import Optimizer

from speedtronic_optim.adamw import (
    DEFAULT_BETAS,
    DEFAULT_EPS,
    DEFAULT_LR,
    DEFAULT_WEIGHT_DECAY,
    make_adamw,
)
from speedtronic_optim.checks import check_arguments, check_parameters, show_value
from speedtronic_optim.distributed_muon import check_process_group
from speedtronic_optim.facade import (
    MergedState,
    check_keys,
    evaluate_closure,
    hooked_load_state_dict,
    hooked_state_dict,
    init_facade,
)
from speedtronic_optim.muon import ADJUST_LR, Muon, check_dense
from speedtronic_optim.saved_state import check_loadable


def _listed(params: Any) -> list[Any]:
    """Return params as a list whose groups' own params are lists too (a generator there would
    be spent by the check below); a set stays one, for torch to refuse.
    """
    listed = []
    for item in params:
        inner = item.get("params") if isinstance(item, dict) else None
        if inner is not None and not isinstance(inner, (torch.Tensor, set, list)):
            item = {**item, "params": list(inner)}
        listed.append(item)
    return listed


def _parameter_ids(params: list[Any]) -> set[int]:
    """Return the ids of the parameters in a list of tensors, (name, tensor) pairs or groups."""
    ids = set()
    for item in params:
        group = item.get("params", []) if isinstance(item, dict) else [item]
        for param in [group] if isinstance(group, torch.Tensor) else group:
            ids.add(id(param[1] if isinstance(param, tuple) else param))
    return ids


class HybridOptimizer(Optimizer):
    """One optimizer facade combining Muon matrices and AdamW parameters.

    ``param_groups`` lists the children's own group dicts (Muon's first), so an LR scheduler drives
    both. ``muon_adjust_lr`` defaults to ``"match_rms_adamw"`` so one learning rate suits both
    branches. ``muon_distributed`` and ``muon_process_group`` are Muon's ``distributed`` and
    ``process_group``: how Newton–Schulz is split over data-parallel ranks.
    """

    def __init__(
        self,
        muon_params: Sequence[torch.Tensor],
        adamw_params: Sequence[torch.Tensor],
        *,
        muon_lr: float = DEFAULT_LR,
        adamw_lr: float = DEFAULT_LR,
        betas: tuple[float, float] = DEFAULT_BETAS,
        eps: float = DEFAULT_EPS,
        weight_decay: float = DEFAULT_WEIGHT_DECAY,
        fused: bool | None = False,
        muon_momentum: float = 0.95,
        muon_ns_steps: int = 5,
        muon_norm_eps: float = 1e-8,
        muon_plus: bool = False,
        muon_adjust_lr: str = "match_rms_adamw",
        muon_distributed: bool | None = None,
        muon_process_group: Any = None,
    ) -> None:
        check_parameters("HybridOptimizer muon_params", muon_params)
        check_parameters("HybridOptimizer adamw_params", adamw_params)
        # Checked before the children exist: an empty branch is never built, and Muon would name
        # its own lr, not muon_lr.
        check_arguments(
            "HybridOptimizer",
            muon_lr=muon_lr,
            adamw_lr=adamw_lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            fused=fused,
            muon_momentum=muon_momentum,
            muon_ns_steps=muon_ns_steps,
            muon_norm_eps=muon_norm_eps,
            muon_plus=muon_plus,
            muon_distributed=muon_distributed,
        )
        if muon_adjust_lr not in ADJUST_LR:
            raise ValueError(
                f"HybridOptimizer muon_adjust_lr: expected one of {ADJUST_LR}, got "
                f"{show_value(muon_adjust_lr)}"
            )
        check_process_group("HybridOptimizer muon_process_group", muon_process_group)
        muon_params, adamw_params = _listed(muon_params), _listed(adamw_params)
        if not muon_params and not adamw_params:
            raise ValueError(
                "HybridOptimizer got no parameters: both muon_params and adamw_params are empty"
            )
        both = _parameter_ids(muon_params) & _parameter_ids(adamw_params)
        if both:  # each branch would step it: two updates per step
            raise ValueError(
                f"HybridOptimizer: {len(both)} parameter(s) are in both muon_params and "
                "adamw_params; give each parameter to one branch (route_parameters splits a model)"
            )
        init_facade(self)
        self.defaults = {"lr": muon_lr, "weight_decay": weight_decay}
        # An empty child would make torch raise "empty parameter list"; leave it out instead.
        self.muon = (
            Muon(
                muon_params,
                lr=muon_lr,
                momentum=muon_momentum,
                ns_steps=muon_ns_steps,
                weight_decay=weight_decay,
                norm_eps=muon_norm_eps,
                muon_plus=muon_plus,
                adjust_lr=muon_adjust_lr,
                distributed=muon_distributed,
                process_group=muon_process_group,
            )
            if muon_params
            else None
        )
        self.adamw = (
            make_adamw(
                adamw_params,
                lr=adamw_lr,
                betas=betas,
                eps=eps,
                weight_decay=weight_decay,
                fused=fused,
            )
            if adamw_params
            else None
        )

    def __getstate__(self) -> dict[str, Any]:
        """Return what pickling keeps: the children (Optimizer's groups and state are views)."""
        return {"muon": self.muon, "adamw": self.adamw, "defaults": self.defaults}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore a pickled or copied hybrid (without hooks, as torch's optimizers)."""
        init_facade(self)
        self.__dict__.update(state)

    @property
    def children(self) -> dict[str, Optimizer]:
        """The non-empty child optimizers by name."""
        return {
            name: child
            for name, child in (("muon", self.muon), ("adamw", self.adamw))
            if child is not None
        }

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Refuse: a group belongs to one branch (Optimizer's version would drop it silently)."""
        raise TypeError(
            "HybridOptimizer.add_param_group: add the group to one branch instead: "
            "optimizer.muon.add_param_group(...) for hidden 2-D matrices or "
            "optimizer.adamw.add_param_group(...) for everything else (build the optimizer with "
            "both branches non-empty to have both)"
        )

    def leaf_optimizers(self) -> list[Optimizer]:
        """Return the plain torch optimizers underneath (what sharded checkpoints address)."""
        return list(self.children.values())

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The children's live group dicts."""
        return [group for child in self.children.values() for group in child.param_groups]

    @property
    def state(self) -> MergedState:  # type: ignore[override]
        """Both children's per-parameter state as one live mapping (the children own it)."""
        return MergedState(lambda: list(self.children.values()))

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Evaluate ``closure`` once, then step Muon and AdamW; returns the closure's loss."""
        loss = evaluate_closure(closure)
        # Both branches first: AdamW refused a sparse gradient after Muon had stepped.
        check_dense("HybridOptimizer", self.param_groups)
        for child in self.children.values():
            child.step()
        return loss

    def state_dict(self) -> dict[str, Any]:
        """Return {"muon": ..., "adamw": ...} for the children present (through its hooks)."""
        return hooked_state_dict(
            self, lambda: {name: child.state_dict() for name, child in self.children.items()}
        )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state saved by a HybridOptimizer with the same branches (through its hooks)."""
        hooked_load_state_dict(self, state_dict, self._load_children)

    def _load_children(self, state_dict: dict[str, Any]) -> None:
        check_keys(state_dict, set(self.children), "HybridOptimizer")
        for name, child in self.children.items():  # all checked first: none loads if one fails
            check_loadable(f"HybridOptimizer.load_state_dict: {name}", child, state_dict[name])
        for name, child in self.children.items():
            child.load_state_dict(state_dict[name])
