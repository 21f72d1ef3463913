"""C-Optim's cautious masking (arXiv 2411.16085) as a wrapper around any optimizer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.optim import Optimizer

from speedtronic_optim.facade import (
    evaluate_closure,
    hooked_load_state_dict,
    hooked_state_dict,
    init_facade,
)


class CautiousOptimizer(Optimizer):
    """Composable cautious wrapper around a Speedtronic/native optimizer.

    After the base step, entries of the observed update that do not descend along the current
    gradient (ascend, in a group with ``maximize=True``) are reverted, and the kept entries are
    scaled by numel / (kept + 1) (C-Optim's rule).
    """

    def __init__(self, base: Optimizer) -> None:
        if not isinstance(base, Optimizer):
            raise TypeError(
                f"CautiousOptimizer wraps a torch.optim.Optimizer; got {type(base).__name__}"
            )
        init_facade(self)
        self.base = base

    def __getstate__(self) -> dict[str, Any]:
        """Return what pickling keeps: the base (Optimizer's groups and state are its views)."""
        return {"base": self.base}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore a pickled or copied wrapper (without hooks, as torch's optimizers)."""
        init_facade(self)
        self.__dict__.update(state)

    def leaf_optimizers(self) -> list[Optimizer]:
        """Return the plain torch optimizers underneath (what sharded checkpoints address)."""
        leaves = getattr(self.base, "leaf_optimizers", None)
        return leaves() if callable(leaves) else [self.base]

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The base optimizer's live groups."""
        return self.base.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        """The base optimizer's state."""
        return self.base.state

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        """The base optimizer's defaults."""
        return self.base.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.base.defaults = value

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Evaluate ``closure`` once, step the base optimizer, then mask misaligned entries."""
        # Called here, not by the base, so the snapshot below sees this step's gradients.
        loss = evaluate_closure(closure)
        snapshot = []
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                if param.is_complex() or param.grad.is_sparse:
                    raise ValueError(
                        "CautiousOptimizer compares the update's sign with the gradient's, "
                        f"entry by entry: it needs real, dense gradients, got a "
                        f"{'complex' if param.is_complex() else 'sparse'} one of shape "
                        f"{tuple(param.shape)}; train without cautious for it"
                    )
                # A maximizing group (torch.optim's maximize=True) ascends: along the gradient.
                sign = -1 if group.get("maximize", False) else 1
                snapshot.append((param, param.detach().clone(), param.grad, sign))
        self.base.step()
        for param, before, grad, sign in snapshot:
            delta = param.detach() - before
            # Moves against the gradient (along it, maximizing): a descent entry. Signs, not
            # delta * grad, which underflows to 0 in fp16; the count is an int64 sum, where
            # fp16's overflows at 65504.
            keep = delta.sign() * grad.sign() * sign < 0
            scale = keep.numel() / (keep.sum() + 1)
            param.copy_(before.add_(delta.mul_(keep).mul_(scale)))
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients through the base optimizer."""
        self.base.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """Return the base optimizer's state dict (the wrapper keeps no state of its own), through
        the wrapper's hooks.
        """
        return hooked_state_dict(self, self.base.state_dict)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load the base optimizer's state through the wrapper's hooks."""
        hooked_load_state_dict(self, state_dict, self.base.load_state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group to the base optimizer."""
        self.base.add_param_group(param_group)
