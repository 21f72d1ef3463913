"""Set up an Optimizer subclass that delegates its groups and state to other optimizers."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import torch
from torch.optim import Optimizer


def init_facade(optimizer: Optimizer) -> None:
    """Give ``optimizer`` the hook tables Optimizer.__init__ would, owning no parameters."""
    # Optimizer.__init__ would assign state/param_groups, which facades expose as live views.
    for name in (
        "_optimizer_step_pre_hooks",
        "_optimizer_step_post_hooks",
        "_optimizer_state_dict_pre_hooks",
        "_optimizer_state_dict_post_hooks",
        "_optimizer_load_state_dict_pre_hooks",
        "_optimizer_load_state_dict_post_hooks",
    ):
        setattr(optimizer, name, OrderedDict())
    optimizer._patch_step_function()


def hooked_state_dict(optimizer: Optimizer, build: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Return ``build()`` through ``optimizer``'s state-dict hooks, as Optimizer.state_dict runs
    them (a facade's own state_dict replaces that method, and would skip the hooks).
    """
    for pre_hook in optimizer._optimizer_state_dict_pre_hooks.values():
        pre_hook(optimizer)
    state_dict = build()
    for post_hook in optimizer._optimizer_state_dict_post_hooks.values():
        result = post_hook(optimizer, state_dict)
        state_dict = state_dict if result is None else result
    return state_dict


def hooked_load_state_dict(
    optimizer: Optimizer, state_dict: dict[str, Any], load: Callable[[dict[str, Any]], None]
) -> None:
    """Call ``load`` through ``optimizer``'s load-state-dict hooks, as Optimizer.load_state_dict
    runs them (on a shallow copy, so a pre hook may edit it without touching the caller's).
    """
    state_dict = state_dict.copy() if isinstance(state_dict, dict) else state_dict
    for pre_hook in optimizer._optimizer_load_state_dict_pre_hooks.values():
        result = pre_hook(optimizer, state_dict)
        state_dict = state_dict if result is None else result
    load(state_dict)
    for post_hook in optimizer._optimizer_load_state_dict_post_hooks.values():
        post_hook(optimizer)


def check_keys(state_dict: dict[str, Any], expected: set[str], owner: str) -> None:
    """Raise a clear error when a state dict was not saved by an optimizer of the same layout."""
    if not isinstance(state_dict, dict) or set(state_dict) != expected:
        found = sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__
        raise ValueError(
            f"{owner}.load_state_dict expected keys {sorted(expected)} but got {found}; the "
            "checkpoint was saved with a different optimizer setup (Muon/Muon+/cautious state is "
            "not interchangeable "
            "with AdamW-only state): start a new run or migrate the checkpoint"
        )


def evaluate_closure(closure: Callable[[], Any] | None) -> Any:
    """Return closure() evaluated once with gradients enabled (None without a closure)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


_MISSING = object()  # MergedState._held's answer for a parameter without state


class MergedState(MutableMapping):
    """A live view of several optimizers' per-parameter state as one mapping.

    Reads find the child that holds a parameter (a parameter without state yet gets a new {} in
    its owner's, as torch.optim's defaultdict does); writes and deletes go to that child; clear()
    empties every child, so ``optimizer.state.clear()`` resets a facade as it does a plain
    torch optimizer.
    """

    def __init__(self, children: Callable[[], list[Optimizer]]) -> None:
        self._children = children

    def _owner(self, param: torch.Tensor) -> Optimizer:
        for child in self._children():
            if any(p is param for group in child.param_groups for p in group["params"]):
                return child
        what = f"shape {tuple(param.shape)}" if isinstance(param, torch.Tensor) else "this key"
        raise KeyError(f"the parameter of {what} is not optimized by this optimizer")

    def _held(self, param: object) -> Any:
        """Return the state a child holds for ``param``, or _MISSING (creating none)."""
        for child in self._children():
            if param in child.state:
                return child.state[param]
        return _MISSING

    def __getitem__(self, param: torch.Tensor) -> Any:
        held = self._held(param)
        # As torch.optim's defaultdict state: a parameter with no state yet gets a new {}.
        return self._owner(param).state[param] if held is _MISSING else held

    def __contains__(self, param: object) -> bool:
        return self._held(param) is not _MISSING

    # get, setdefault and pop act as dict's, which skip the defaultdict's new {} (the Mapping
    # mixins would read it through __getitem__: setdefault and pop then dropped their default).
    def get(self, param: torch.Tensor, default: Any = None) -> Any:
        """Return the parameter's state, or ``default`` (creating none, as dict.get)."""
        held = self._held(param)
        return default if held is _MISSING else held

    def setdefault(self, param: torch.Tensor, default: Any = None) -> Any:
        """Return the parameter's state, storing ``default`` as it when it has none."""
        held = self._held(param)
        if held is _MISSING:
            self[param] = held = default
        return held

    def pop(self, param: torch.Tensor, *default: Any) -> Any:
        """Remove and return the parameter's state, or return ``default`` when it has none."""
        for child in self._children():
            if param in child.state:
                return child.state.pop(param)
        if default:
            return default[0]
        raise KeyError("this parameter has no optimizer state")

    def __setitem__(self, param: torch.Tensor, value: Any) -> None:
        self._owner(param).state[param] = value

    def __delitem__(self, param: torch.Tensor) -> None:
        del self._owner(param).state[param]

    def __iter__(self) -> Iterator[torch.Tensor]:
        for child in self._children():
            yield from child.state

    def __len__(self) -> int:
        return sum(len(child.state) for child in self._children())

    def clear(self) -> None:
        """Drop every child's state (what a DiLoCo reset asks for)."""
        for child in self._children():
            child.state.clear()
