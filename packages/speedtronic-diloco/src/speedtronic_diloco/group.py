"""A DiLoCo node that is a data-parallel group: rank 0 decides, every rank follows.

Only rank 0 of a node talks to the Hub. At a boundary it decides (and may wait); the decision then
reaches every rank in one broadcast, and the model moves between rank 0 and the replicas only in
the collectives that decision names, so every rank runs the same collectives in the same order.
The full model state (the Hub format) exists on rank 0 alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

from speedtronic_diloco.tensors import cpu_state_dict
from speedtronic_systems.parallel import SINGLE, ParallelContext, unwrap_model

T = TypeVar("T")


class NodeRankError(RuntimeError):
    """Rank 0 of this node failed while deciding; raised on the other ranks with its message."""


@dataclass(frozen=True)
class _Failed:
    """What the other ranks receive instead of a decision when rank 0's raised."""

    message: str


class NodeGroup:
    """The ranks of one DiLoCo node (a plain process, a DDP group or an FSDP2 group)."""

    def __init__(self, parallel: ParallelContext = SINGLE) -> None:
        self.parallel = parallel

    @property
    def is_lead(self) -> bool:
        """Return True on the rank that runs the Hub lanes and the outer loop (rank 0)."""
        return self.parallel.is_main

    def decide(self, decide: Callable[[], T]) -> T:
        """Run `decide` on rank 0 and return its (small, picklable) result on every rank.

        When it raises, the other ranks raise NodeRankError instead of waiting for a decision
        that never comes.
        """
        if not self.parallel.active:
            return decide()
        if not self.is_lead:
            value = self.parallel.broadcast_object(None)
            if isinstance(value, _Failed):
                raise NodeRankError(f"rank 0 of this DiLoCo node failed: {value.message}")
            return value
        try:
            value = decide()
        except Exception as exc:
            self.parallel.broadcast_object(_Failed(f"{type(exc).__name__}: {exc}"))
            raise
        return self.parallel.broadcast_object(value)

    def state_reader(self, model: torch.nn.Module) -> Callable[[], dict[str, torch.Tensor]]:
        """Return a reader of the model's full state as independent CPU tensors, for rank 0.

        FSDP2 gathers the shards now, a collective every rank must reach; otherwise rank 0 copies
        its own replica when (and if) the reader is called. Keys are the user's module's.
        """
        if self.parallel.mode == "fsdp":
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_model_state_dict,
            )

            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            gathered = get_model_state_dict(model, options=options)  # empty on ranks but 0
            return lambda: gathered
        return lambda: cpu_state_dict(unwrap_model(model).state_dict())

    def state_shapes(self, model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
        """Return the full shape of every state entry of the model (FSDP2: of the whole tensor)."""
        state = unwrap_model(model).state_dict()
        return {name: tuple(t.shape) for name, t in state.items() if isinstance(t, torch.Tensor)}

    def state_dtypes(self, model: torch.nn.Module) -> dict[str, torch.dtype]:
        """Return the dtype of every state entry of the model."""
        state = unwrap_model(model).state_dict()
        return {name: t.dtype for name, t in state.items() if isinstance(t, torch.Tensor)}

    def load(self, model: torch.nn.Module, state: Mapping[str, torch.Tensor] | None) -> None:
        """Make every rank's model hold rank 0's `state` (None on the other ranks)."""
        if self.parallel.mode == "fsdp":
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
            )

            options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
            # set_model_state_dict replaces the entries of the dict it is given: hand it a copy.
            set_model_state_dict(model, dict(state or {}), options=options)
            return
        own = unwrap_model(model).state_dict()
        with torch.no_grad():
            if state is not None:
                for name, tensor in own.items():
                    tensor.copy_(state[name])
            if self.parallel.active:
                _broadcast_from_rank0(own.values())


def _broadcast_from_rank0(tensors: Iterable[torch.Tensor]) -> None:
    """Overwrite every rank's tensors with rank 0's, in place (state_dict order on every rank)."""
    seen: set[int] = set()
    for tensor in tensors:
        if tensor.data_ptr() in seen:  # tied weights: one storage, one broadcast
            continue
        seen.add(tensor.data_ptr())
        dist.broadcast(tensor, src=0)


__all__ = ["NodeGroup", "NodeRankError"]
