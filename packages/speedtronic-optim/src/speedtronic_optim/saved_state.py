"""Checks that a saved optimizer state fits the optimizer about to load it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.optim import Optimizer

from speedtronic_optim.checks import show_value


def check_state_dict(owner: str, saved: Any) -> None:
    """Raise unless ``saved`` is a mapping, as torch.optim's load_state_dict needs one."""
    if not isinstance(saved, Mapping):
        raise TypeError(f"{owner}: expected a state dict, got {show_value(saved)}")


def check_layout(owner: str, saved: Mapping[str, Any], options: Sequence[str]) -> None:
    """Raise unless ``saved`` has torch.optim's keys and every saved group has ``options``: a
    state saved by another optimizer otherwise fails inside torch (``KeyError``) or, where the
    loading optimizer fills in missing options, loads silently with none of its own.
    """
    if not {"state", "param_groups"} <= set(saved):
        hint = "; a HybridOptimizer's: load its state_dict()['muon']" if "muon" in saved else ""
        raise ValueError(
            f"{owner}: expected a torch.optim state dict (keys 'param_groups' and 'state'), got "
            f"keys {sorted(saved, key=str)}{hint}"
        )
    for index, group in enumerate(saved["param_groups"]):
        missing = [name for name in options if name not in group]
        if missing:
            raise ValueError(
                f"{owner}: group {index} of the state has no {', '.join(missing)}: another "
                f"optimizer saved it (its options: {show_value(sorted(set(group) - {'params'}))}); "
                "load it into the optimizer that saved it, or start this one fresh"
            )


def check_state_shapes(owner: str, groups: list[dict[str, Any]], state: dict[Any, Any]) -> None:
    """Raise unless each tensor in a parameter's state has the parameter's shape.

    torch.optim pairs saved and live parameters by position, so a momentum or moment saved for
    another model or another order loads, and every step() then fails with a bare broadcasting
    error.
    """
    for group_index, group in enumerate(groups):
        for index, param in enumerate(group["params"]):
            held = state.get(param)
            for key, value in held.items() if isinstance(held, dict) else ():
                # "step" is torch.optim's count (a 0-d tensor in AdamW), not a per-entry buffer.
                if key != "step" and isinstance(value, torch.Tensor) and value.shape != param.shape:
                    raise ValueError(
                        f"{owner}: parameter {index} of group {group_index} has shape "
                        f"{tuple(param.shape)} but its saved {key} {tuple(value.shape)}: the state "
                        "was saved for another model, or with the groups or parameters in another "
                        "order; load it into the saved run's model, its optimizer built in the "
                        "saved run's order"
                    )


def check_loadable(owner: str, optimizer: Optimizer, saved: Any) -> None:
    """Raise unless the torch.optim state dict ``saved`` fits ``optimizer``, changing nothing.

    Checks the group and parameter counts (what Optimizer.load_state_dict checks while it loads)
    and the state's shapes (what it does not): a facade checks every child first, so a refused
    one leaves none loaded.
    """
    if not isinstance(saved, dict) or not {"state", "param_groups"} <= set(saved):
        return  # malformed: the child's own load_state_dict names what is missing
    groups, saved_groups = optimizer.param_groups, saved["param_groups"]
    if len(groups) != len(saved_groups):
        raise ValueError(
            f"{owner}: the optimizer has {len(groups)} parameter groups but the state "
            f"{len(saved_groups)}; it was saved for another model or optimizer setup"
        )
    mapped = {}
    for group_index, (group, saved_group) in enumerate(zip(groups, saved_groups, strict=True)):
        if len(group["params"]) != len(saved_group["params"]):
            raise ValueError(
                f"{owner}: group {group_index} has {len(group['params'])} parameters but the "
                f"state's {len(saved_group['params'])}; it was saved for another model or "
                "optimizer setup"
            )
        for param, key in zip(group["params"], saved_group["params"], strict=True):
            mapped[param] = saved["state"].get(key)
    check_state_shapes(owner, groups, mapped)
