"""Muon's Newton–Schulz split over data-parallel ranks: DDP replicas and FSDP2 shards.

Every rank updates momentum for the parameters it holds (DDP: whole matrices; FSDP2: its dim-0
shards); only the orthogonalization is partitioned. Each matrix has one owner rank, chosen by a
deterministic balanced partition that every rank computes alike. DDP: owners orthogonalize their
matrices and one all-gather hands every rank every update. FSDP2: one all-to-all brings each
matrix's shards to its owner and a second sends the shards of the update back. Only
``torch.distributed`` collectives on plain (local) tensors are used, never DTensor
redistribution. FSDP2 parameters say what they are; plain ones are split only when the caller
says they are replicas. Without a process group of more than one rank nothing here runs.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

# Orthogonalizes whole matrices (any shapes) and returns one update per matrix.
Orthogonalize = Callable[[list[torch.Tensor]], list[torch.Tensor]]
# Applies weight decay and ``update * -adjusted_lr(shape)`` to same-shaped (local) tensors.
Apply = Callable[[list[torch.Tensor], list[torch.Tensor], torch.Size], None]


def _dtensor_type() -> type | None:
    """Return torch's DTensor class, or None where torch has no distributed support."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        try:  # torch 2.4 kept DTensor here only
            from torch.distributed._tensor import DTensor
        except ImportError:
            return None
    return DTensor


_DTENSOR = _dtensor_type()


def is_sharded(tensor: torch.Tensor) -> bool:
    """Return True for a DTensor (an FSDP2 parameter); False for a plain tensor."""
    # isinstance, not hasattr: torch 2.4's compiler cannot trace hasattr on a tensor.
    return _DTENSOR is not None and isinstance(tensor, _DTENSOR)


@dataclass(frozen=True)
class WorkSplit:
    """How Muon's Newton–Schulz work is divided: over replicas or over shards, in `group`."""

    sharded: bool
    group: Any  # torch.distributed.ProcessGroup
    rank: int
    world: int

    def step(
        self,
        params: list[torch.Tensor],
        directions: list[torch.Tensor],
        orthogonalize: Orthogonalize,
        apply: Apply,
    ) -> None:
        """Orthogonalize this rank's share, exchange, and apply every update (same on all ranks)."""
        for indices in _dtype_buckets(params, directions):
            bucket = [params[i] for i in indices], [directions[i] for i in indices]
            if self.sharded:
                self._sharded_step(*bucket, orthogonalize, apply)
            else:
                self._replicated_step(*bucket, orthogonalize, apply)

    def _replicated_step(
        self,
        params: list[torch.Tensor],
        directions: list[torch.Tensor],
        orthogonalize: Orthogonalize,
        apply: Apply,
    ) -> None:
        owned = owned_matrices([tuple(p.shape) for p in params], self.world)
        mine = owned[self.rank]
        ours = orthogonalize([directions[i] for i in mine])
        dtype, device = params[0].dtype, params[0].device
        # all_gather needs equal sizes: pad every rank's share to the largest one.
        width = max(sum(params[i].numel() for i in share) for share in owned)
        send = _flat([update.reshape(-1) for update in ours], dtype, device, width)
        gathered = torch.empty(self.world * width, dtype=dtype, device=device)
        # all_gather_single (torch 2.13) replaces all_gather_into_tensor, now deprecated.
        all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        all_gather(gathered, send, group=self.group)
        updates: list[torch.Tensor | None] = [None] * len(params)
        for rank, share in enumerate(owned):
            sizes = [params[i].numel() for i in share]
            pieces = gathered[rank * width : rank * width + sum(sizes)].split(sizes)
            for index, piece in zip(share, pieces, strict=True):
                updates[index] = piece.view(params[index].shape)
        _apply_by_shape(params, updates, [p.shape for p in params], apply)

    def _sharded_step(
        self,
        params: list[torch.Tensor],
        directions: list[torch.Tensor],
        orthogonalize: Orthogonalize,
        apply: Apply,
    ) -> None:
        shapes = [tuple(p.shape) for p in params]
        owned = owned_matrices(shapes, self.world)
        mine = owned[self.rank]
        local = [direction.to_local() for direction in directions]
        for index, shard in enumerate(local):
            expected = shard_rows(shapes[index][0], self.world, self.rank)
            if shard.shape[0] != expected[1] - expected[0]:
                raise RuntimeError(
                    f"Muon expected dim-0 shards of {shapes[index]} with rows {expected} on rank "
                    f"{self.rank}, found {tuple(shard.shape)}; pass distributed=False to update "
                    "these parameters without splitting"
                )
        # Sent: for each owner in rank order, this rank's shards of the matrices it owns.
        sent = [index for share in owned for index in share]
        send_sizes = [sum(local[i].numel() for i in share) for share in owned]
        # Received: for each source rank, its shards of the matrices this rank owns.
        piece_sizes = [
            [_rows(shapes[i], self.world, source) * shapes[i][1] for i in mine]
            for source in range(self.world)
        ]
        recv_sizes = [sum(sizes) for sizes in piece_sizes]
        device = local[0].device
        gathered = self._all_to_all(
            [local[i].reshape(-1) for i in sent], send_sizes, recv_sizes, local[0].dtype, device
        )
        by_source = [
            chunk.split(sizes)
            for chunk, sizes in zip(gathered.split(recv_sizes), piece_sizes, strict=True)
        ]
        full = [
            torch.cat(
                [by_source[source][k].view(-1, shapes[index][1]) for source in range(self.world)]
            )
            for k, index in enumerate(mine)
        ]
        ours = orthogonalize(full)
        # Send each rank its rows of every update this rank computed; it gets them in `sent` order.
        returned = [
            update[slice(*shard_rows(shapes[index][0], self.world, dest))].reshape(-1)
            for dest in range(self.world)
            for index, update in zip(mine, ours, strict=True)
        ]
        flat = self._all_to_all(returned, recv_sizes, send_sizes, params[0].dtype, device)
        updates: list[torch.Tensor | None] = [None] * len(params)
        for index, piece in zip(sent, flat.split([local[i].numel() for i in sent]), strict=True):
            updates[index] = piece.view(local[index].shape)
        local_params = [param.to_local() for param in params]
        _apply_by_shape(local_params, updates, [p.shape for p in params], apply)

    def _all_to_all(
        self,
        pieces: list[torch.Tensor],
        send_sizes: list[int],
        recv_sizes: list[int],
        dtype: torch.dtype,
        device: torch.device,
    ) -> torch.Tensor:
        send = _flat(pieces, dtype, device, sum(send_sizes))
        received = torch.empty(sum(recv_sizes), dtype=dtype, device=device)
        dist.all_to_all_single(received, send, recv_sizes, send_sizes, group=self.group)
        return received


def check_process_group(where: str, group: Any) -> None:
    """Raise TypeError unless `group` is None (the world) or a torch.distributed ProcessGroup."""
    if group is not None and not (dist.is_available() and isinstance(group, dist.ProcessGroup)):
        raise TypeError(
            f"{where}: expected a torch.distributed ProcessGroup or None (the world), got "
            f"{type(group).__name__}"
        )


def work_split(
    params: Sequence[torch.Tensor], distributed: bool | None, process_group: Any = None
) -> WorkSplit | None:
    """Return how to split Muon's work for `params`, or None to do all of it in this process.

    FSDP2 (DTensor) parameters are split over their mesh's group unless ``distributed=False``.
    Plain parameters are split only with ``distributed=True`` (they must be DDP replicas), over
    `process_group` (default: the world); without a process group of more than one rank, never.
    ``True`` also refuses DTensor layouts other than FSDP2's instead of warning.
    """
    if distributed is False or not params:
        return None
    if any(is_sharded(p) for p in params):
        return _sharded_split(params, required=bool(distributed))
    # A process group alone does not make plain parameters replicas: only the caller knows.
    if not distributed or not (dist.is_available() and dist.is_initialized()):
        return None
    world = dist.get_world_size(process_group)
    if world == 1:
        return None
    return WorkSplit(False, process_group, dist.get_rank(process_group), world)


def _sharded_split(params: Sequence[torch.Tensor], required: bool) -> WorkSplit | None:
    mesh = getattr(params[0], "device_mesh", None)
    problem = None
    if not all(is_sharded(p) and p.device_mesh == mesh for p in params):
        problem = "needs every parameter of a group sharded on one device mesh"
    elif mesh.ndim != 1 or not all(p.placements[0].is_shard(0) for p in params):
        found = sorted({str(tuple(p.placements)) for p in params})
        problem = f"supports Shard(0) on a 1-D mesh (FSDP2); found {found} on a {mesh.ndim}-D mesh"
    if problem is None:
        group = mesh.get_group()
        return WorkSplit(True, group, dist.get_rank(group), dist.get_world_size(group))
    message = f"distributed Muon {problem}"
    if required:
        raise ValueError(f"{message}; pass distributed=False to update them without splitting")
    # Auto mode keeps working (every rank does all the work, through DTensor redistribution).
    warnings.warn(f"{message}: every rank orthogonalizes every matrix", stacklevel=3)
    return None


def newton_schulz_cost(shape: Sequence[int]) -> int:
    """Return a matrix's Newton–Schulz cost in flop units: rows * cols * min(rows, cols)."""
    rows, cols = shape[-2], shape[-1]
    return rows * cols * min(rows, cols)


@functools.lru_cache(maxsize=64)
def _owners(shapes: tuple[tuple[int, ...], ...], world: int) -> tuple[tuple[int, ...], ...]:
    # Largest first onto the least-loaded rank (ties: lower rank, lower index): within 4/3 of the
    # best balance, and identical on every rank because it depends on the shapes only.
    order = sorted(range(len(shapes)), key=lambda i: (-newton_schulz_cost(shapes[i]), i))
    loads = [0] * world
    owned: list[list[int]] = [[] for _ in range(world)]
    for index in order:
        rank = min(range(world), key=loads.__getitem__)  # cached: computed once per layout
        owned[rank].append(index)
        loads[rank] += newton_schulz_cost(shapes[index])
    return tuple(tuple(sorted(share)) for share in owned)


def owned_matrices(shapes: Sequence[Sequence[int]], world: int) -> tuple[tuple[int, ...], ...]:
    """Return, per rank, the indices of the matrices it orthogonalizes (balanced by cost)."""
    return _owners(tuple(tuple(shape) for shape in shapes), world)


def shard_rows(rows: int, world: int, rank: int) -> tuple[int, int]:
    """Return the [start, end) rows of `rank`'s Shard(0) piece (torch.chunk's split)."""
    chunk = -(-rows // world)
    return min(rows, rank * chunk), min(rows, (rank + 1) * chunk)


def _rows(shape: Sequence[int], world: int, rank: int) -> int:
    start, end = shard_rows(shape[0], world, rank)
    return end - start


def init_sharded_state(
    state: dict[torch.Tensor, dict[str, Any]], params: list[torch.Tensor]
) -> None:
    """Create the momentum of every sharded parameter now, sharded like it, on every rank."""
    # Checkpoints (DCP's get_state_dict) then see the same keys on every rank before any step,
    # and the momentum of every matrix is saved, not only on its owner.
    for param in params:
        if is_sharded(param) and "momentum_buffer" not in state[param]:
            state[param]["momentum_buffer"] = torch.zeros_like(param)


def _dtype_buckets(params: list[torch.Tensor], directions: list[torch.Tensor]) -> list[list[int]]:
    # One collective carries one dtype: group by (param dtype, direction dtype, device).
    buckets: dict[tuple[Any, ...], list[int]] = {}
    for index, (param, direction) in enumerate(zip(params, directions, strict=True)):
        key = (param.dtype, direction.dtype, param.device)
        buckets.setdefault(key, []).append(index)
    return list(buckets.values())


def _flat(
    pieces: list[torch.Tensor], dtype: torch.dtype, device: torch.device, size: int
) -> torch.Tensor:
    # The pieces, cast to `dtype` while copied, in one buffer of `size` (zero padded).
    flat = torch.empty(size, dtype=dtype, device=device)
    offset = 0
    for piece in pieces:
        flat[offset : offset + piece.numel()].copy_(piece.reshape(-1))
        offset += piece.numel()
    flat[offset:].zero_()
    return flat


def _apply_by_shape(
    params: list[torch.Tensor],
    updates: list[torch.Tensor | None],
    shapes: list[torch.Size],
    apply: Apply,
) -> None:
    # The lr scale depends on the full matrix shape, so same-shaped matrices are applied together.
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for index, shape in enumerate(shapes):
        by_shape.setdefault(tuple(shape), []).append(index)
    for indices in by_shape.values():
        apply(
            [params[i] for i in indices],
            [updates[i] for i in indices],  # type: ignore[misc]
            shapes[indices[0]],
        )
