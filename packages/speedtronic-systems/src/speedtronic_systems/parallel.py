"""Data parallelism on torch.distributed: the process group, DDP/FSDP2 wrapping, and the few
cross-rank agreements a training loop needs (sums, any-flags, barriers, object gathers).

Launch with torchrun (elastic, c10d rendezvous); this module reads its environment (RANK,
WORLD_SIZE, LOCAL_RANK), never re-implements it. One process needs none of it: SINGLE is the
context of a plain run, and every collective on it is a no-op.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import importlib
import inspect
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from speedtronic_config import ConfigError, ParallelConfig, resolve_section
from speedtronic_config.errors import describe_ranks, on_every_rank

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Module containers whose children FSDP2 shards one by one (the transformer blocks).
_BLOCK_CONTAINERS = ("blocks", "layers", "h")
# fsdp needs torch.distributed.fsdp's public fully_shard (2.6) and, to shard a single-file
# checkpoint's optimizer state, distribute_tensor(src_data_rank=) (2.7).
FSDP_MIN_TORCH = (2, 7)


def check_fsdp_torch() -> None:
    """Raise ConfigError when this torch is older than data_parallel fsdp needs."""
    if torch.__version__ < FSDP_MIN_TORCH:
        raise on_every_rank(
            ConfigError(
                "parallel.data_parallel",
                f"is fsdp, which needs torch>=2.7 (FSDP2's public fully_shard); this is torch "
                f"{torch.__version__}",
                allowed="upgrade torch, or set parallel.data_parallel: ddp",
            )
        )


class ParallelError(RuntimeError):
    """A data-parallel setup that cannot work: the launch, the backend, the model or the order."""


@dataclass(frozen=True)
class ParallelContext:
    """This process's place in the data-parallel group and the collectives the loop asks of it."""

    mode: str = "none"  # none, ddp or fsdp
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """Return True on the rank that logs, reports and writes single-file checkpoints."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        """Return True when there are other ranks to agree with."""
        return self.world_size > 1

    def _reduce_device(self) -> torch.device:
        # NCCL reduces CUDA tensors only; gloo (and a cpu:gloo,cuda:nccl group) takes CPU ones.
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        """Return the element-wise sum of `values` over every rank (float64, one collective)."""
        if not self.active:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=self._reduce_device())
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor.tolist()

    def any(self, flag: bool) -> bool:
        """Return True when `flag` is true on any rank (every rank gets the same answer)."""
        return self.all_reduce_sum([1.0 if flag else 0.0])[0] > 0

    def barrier(self) -> None:
        """Wait until every rank reaches this point."""
        if self.active:
            dist.barrier()

    def all_gather_object(self, value: Any) -> list[Any]:
        """Return every rank's `value`, in rank order (picklable objects only)."""
        if not self.active:
            return [value]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, value)
        return gathered

    def disagreement(self, value: Any) -> str | None:
        """Return None when every rank holds the same `value` (one all_gather_object), else which
        rank holds which (describe_ranks), for the error or warning every rank then raises alike.
        """
        values = self.all_gather_object(value)
        return None if len(set(values)) == 1 else describe_ranks(values)

    def disagreements(self, values: dict[str, Any]) -> dict[str, str]:
        """Return, for each name in `values` whose value differs between ranks, which rank holds
        which (describe_ranks); one all_gather_object for them all.
        """
        gathered = self.all_gather_object(values)
        splits = {name: [seen[name] for seen in gathered] for name in values}
        return {name: describe_ranks(s) for name, s in splits.items() if len(set(s)) > 1}

    def broadcast_object(self, value: Any, src: int = 0) -> Any:
        """Return rank `src`'s `value` on every rank."""
        if not self.active:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=src)
        return box[0]


SINGLE = ParallelContext()


def launched_world_size() -> int:
    """Return WORLD_SIZE as torchrun set it (1 outside torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def resolve_backend(backend: str, device: torch.device) -> str:
    """Return the process-group backend for `auto` (gloo on CPU, cpu:gloo,cuda:nccl on CUDA), or
    the requested one after checking it is available in this build.
    """
    if backend == "auto":
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    names = {part.split(":")[-1] for part in backend.split(",")}
    available = {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available()}
    available["mpi"] = dist.is_mpi_available()
    missing = sorted(name for name in names if not available.get(name, False))
    if missing:
        raise ConfigError(
            "parallel.backend",
            f"{', '.join(missing)} is not available in this PyTorch build",
            value=backend,
            allowed="use auto (gloo on CPU, nccl on CUDA) or gloo",
        )
    if device.type != "cuda" and "nccl" in names and "cpu:" not in backend:
        raise ConfigError(
            "parallel.backend",
            "nccl reduces CUDA tensors only, and this run is on the CPU",
            value=backend,
            allowed="use auto or gloo",
        )
    return backend


def worker_device(device: torch.device, local_rank: int) -> torch.device:
    """Return the device the node's worker `local_rank` of a data-parallel run trains on:
    cuda:LOCAL_RANK on CUDA (one GPU per worker), else `device`.
    """
    if device.type != "cuda":
        return device
    count = torch.cuda.device_count()
    if local_rank >= count:
        from speedtronic_systems.precision import DeviceError  # precision imports this module

        raise DeviceError(
            f"worker {local_rank} of this node needs cuda:{local_rank}, but the node has {count} "
            f"CUDA device(s); set --nproc-per-node to at most {count}"
        )
    return torch.device("cuda", local_rank)


def init_parallel(section: Any, device: torch.device) -> ParallelContext:
    """Join the process group torchrun describes and return this rank's context (SINGLE for a
    plain run). On CUDA each rank uses cuda:LOCAL_RANK.
    """
    section: ParallelConfig = resolve_section(section, "parallel")
    check_world_size(section, launched_world_size())
    if section.data_parallel == "none":
        return SINGLE
    if section.data_parallel == "fsdp":
        check_fsdp_torch()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = worker_device(device, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ:  # a plain `python` start: a group of one on loopback
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
            os.environ.setdefault("RANK", "0")
            os.environ.setdefault("WORLD_SIZE", "1")
        timeout = datetime.timedelta(seconds=section.timeout_s)
        # DDP and torch.compile import torch._dynamo. Imported after the group exists, it keeps
        # references to the group that destroy_process_group cannot drop: the group would outlive
        # shutdown_parallel, which says why that hangs or aborts a finished run.
        importlib.import_module("torch._dynamo")
        dist.init_process_group(
            backend=resolve_backend(section.backend, device),
            timeout=timeout,
            device_id=device if device.type == "cuda" else None,
            **_fresh_store(timeout),
        )
    return ParallelContext(
        section.data_parallel, dist.get_rank(), dist.get_world_size(), local_rank, device
    )


def check_world_size(section: Any, world_size: int) -> None:
    """Raise ConfigError when `world_size` processes would each train alone (no data-parallel
    mode set).
    """
    section = resolve_section(section, "parallel")
    if section.data_parallel == "none" and world_size > 1:
        raise on_every_rank(
            ConfigError(
                "parallel.data_parallel",
                f"is none, but {world_size} processes are launched: each would train alone",
                allowed="set parallel.data_parallel: ddp (or fsdp)",
            )
        )


def elastic_restarts() -> tuple[int, int]:
    """Return (the restarts torchrun has made of this worker's group, the most --max-restarts
    allows); (0, 0) outside torchrun.
    """
    made = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return int(made), int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))


# How many process groups this process has joined: a sweep (train_from_config in a loop) joins
# one per run, the same count on every rank.
_groups_joined = 0


def _fresh_store(timeout: datetime.timedelta) -> dict[str, Any]:
    """Return init_process_group's store arguments for a group a worker torchrun restarted, or
    a later group of the same worker, else {}.

    torchrun's c10d rendezvous keeps one store for every restart round, and workers join it
    without a per-attempt or per-group prefix, so a restarted group, or the next run's group in
    a sweep, would read the earlier group's gloo addresses (a connection refused or a hang). A
    prefix per attempt and per group keeps each apart.
    """
    global _groups_joined
    group, _groups_joined = _groups_joined, _groups_joined + 1
    if elastic_restarts()[0] == 0 and group == 0:
        return {}
    store = agent_store(timeout)
    if store is None:
        return {}
    return {
        "store": dist.PrefixStore(f"group_{group}", store) if group else store,
        "rank": int(os.environ["RANK"]),
        "world_size": int(os.environ["WORLD_SIZE"]),
    }


def agent_store(timeout: datetime.timedelta, *, every_round: bool = False) -> dist.Store | None:
    """Return this restart round's part of the store torchrun's agent keeps for its workers
    (None when the workers have none), whether or not a process group exists; with
    `every_round`, the part every restart round of the launch shares.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    client = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    scope = "launch" if every_round else f"attempt_{elastic_restarts()[0]}"
    return dist.PrefixStore(f"speedtronic/{scope}", client)


def torchrun_worker() -> bool:
    """Return True in a worker torchrun's agent started: the agent passes its signals on to it."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def shutdown_parallel(context: ParallelContext) -> None:
    """Leave the process group this process joined (a no-op for a plain run).

    Drop the DDP-wrapped model first. Then the group is destroyed here, with the GIL released, and
    gloo's threads finish with the tensors of the last collectives and stop. A DDP reducer that
    outlives it destroys the group later while holding the GIL (a deadlock when a gloo thread
    still needs it), or during interpreter shutdown (an abort: "terminate called without an
    active exception").
    """
    if context.mode != "none" and dist.is_initialized():
        gc.collect()  # a model the caller dropped may still sit in a reference cycle
        dist.destroy_process_group()


def check_batch_split(target_batch_size: int, micro_batch_size: int, world_size: int) -> None:
    """Raise ConfigError unless the target batch splits into whole microbatches on every rank."""
    if world_size <= 1:
        return
    per_rank, rest = divmod(target_batch_size, world_size)
    if rest or per_rank % micro_batch_size:
        allowed = f"use a multiple of {world_size * micro_batch_size} (world size x "
        allowed += "micro_batch_size)"
        if not rest and per_rank:  # the same global batch fits with smaller microbatches
            fits = max(d for d in range(1, micro_batch_size) if per_rank % d == 0)
            allowed += f", or keep it with data.micro_batch_size: {fits} ({per_rank} per rank)"
        raise on_every_rank(
            ConfigError(
                "data.target_batch_size",
                f"{target_batch_size} does not split over {world_size} ranks into whole "
                f"microbatches of {micro_batch_size}",
                allowed=allowed,
            )
        )


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """Return the repeated blocks FSDP2 shards one by one: the children of a ModuleList named
    blocks, layers or h, or what the model's fsdp_units() returns.
    """
    units = getattr(model, "fsdp_units", None)
    if callable(units):
        return list(units())
    for name in _BLOCK_CONTAINERS:
        container = getattr(model, name, None)
        if isinstance(container, nn.ModuleList) and len(container) > 0:
            return list(container)
    return []


def wrap_model(model: nn.Module, context: ParallelContext, section: Any) -> nn.Module:
    """Return the model wrapped for its data-parallel mode (DDP, or FSDP2 per block then the
    root), holding rank 0's weights on every rank in both; unchanged for a plain run. Build the
    optimizer from the returned model's parameters.
    """
    section = resolve_section(section, "parallel")
    if context.mode == "ddp":
        ids = [context.device.index] if context.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids, **_buffer_options(model))
    if context.mode != "fsdp":
        return model
    check_fsdp_torch()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    blocks = transformer_blocks(model)
    if not blocks:
        raise ConfigError(
            "parallel.data_parallel",
            f"fsdp needs blocks to shard, and {type(model).__name__} has no ModuleList named "
            f"{', '.join(_BLOCK_CONTAINERS)} and no fsdp_units() method",
            allowed="use ddp, or give the model an fsdp_units() returning its blocks",
        )
    mesh = init_device_mesh(context.device.type, (context.world_size,))
    policy = MixedPrecisionPolicy(
        param_dtype=_DTYPES.get(section.fsdp_param_dtype),
        reduce_dtype=_DTYPES.get(section.fsdp_reduce_dtype),
    )
    options = {
        "mesh": mesh,
        "mp_policy": policy,
        "reshard_after_forward": section.fsdp_reshard_after_forward,
    }
    _broadcast_module_states(model, context)  # before fully_shard keeps this rank's shards
    for block in blocks:
        fully_shard(block, **options)
    fully_shard(model, **options)
    return model


def _broadcast_module_states(model: nn.Module, context: ParallelContext) -> None:
    """Copy rank 0's parameters and saved buffers into every rank's `model`, in place: what DDP
    does when it wraps a model, and FSDP2's fully_shard does not (each rank would keep its shards
    of its own weights). Ranks can hold other weights: each node reads its own copy of
    model.init_from, and one may be stale.
    """
    if not context.active:
        return
    # Not the state_dict's values: a module's get_extra_state() entry there is any object. Each
    # listing holds a tied tensor once.
    with torch.no_grad():
        for tensor in [*model.parameters(), *_saved_buffers(model)]:
            dist.broadcast(tensor.detach(), src=0)


def _buffer_options(model: nn.Module) -> dict[str, bool]:
    """Return DDP's keywords on buffers: its default, a broadcast of rank 0's buffers before every
    forward, only for a model with buffers its state_dict saves (running statistics).

    Non-persistent buffers (RoPE tables, masks) are derived alike on every rank, and the
    broadcast is a collective per forward (one also held a gloo rank whose peer had died until
    torchrun killed it, silently). torch 2.13 renamed the flag; the old one also leaves buffers
    out of DDP's initial sync, which derived ones do not need.
    """
    if _saved_buffers(model):
        return {}
    renamed = (
        "forward_sync_buffers" in inspect.signature(nn.parallel.DistributedDataParallel).parameters
    )
    return {"forward_sync_buffers" if renamed else "broadcast_buffers": False}


def _saved_buffers(model: nn.Module) -> list[torch.Tensor]:
    """Return the model's buffers its state_dict saves (the persistent ones), each once."""
    saved = model.state_dict(keep_vars=True).keys()
    return [buffer for name, buffer in model.named_buffers() if name in saved]


def unwrap_model(model: nn.Module) -> nn.Module:
    """Return the user's module inside DDP and ``torch.compile`` wrappers (FSDP2 shards in place:
    the same module). A model its user compiled keeps its weights, class and label convention
    in ``_orig_mod``: its checkpoint would hold ``_orig_mod.`` keys, and a transformers causal LM
    would be given labels it shifts again.
    """
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif _is_compiled(model):
            model = model._orig_mod
        else:
            return model


def _is_compiled(model: nn.Module) -> bool:
    """Return True for torch.compile's OptimizedModule, without importing torch._dynamo: until
    something imported it, nothing was compiled.
    """
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return eval_frame is not None and isinstance(model, eval_frame.OptimizedModule)


def model_class_name(model: nn.Module) -> str:
    """Return the qualified name of the user's model class (what a checkpoint records): seen
    through a DDP wrapper and past the ``FSDP<Name>`` subclass FSDP2's fully_shard makes.
    """
    try:
        from torch.distributed.fsdp import FSDPModule

        wrappers: tuple[type, ...] = (FSDPModule,)
    except ImportError:  # torch built without distributed support: nothing is FSDP2-wrapped
        wrappers = ()
    cls = next(c for c in type(unwrap_model(model)).__mro__ if not issubclass(c, wrappers))
    return f"{cls.__module__}.{cls.__qualname__}"


def check_optimizer_after_wrapping(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Raise ParallelError when the optimizer holds parameters the wrapped model no longer uses:
    an optimizer built before fully_shard would silently never update the sharded weights.
    """
    current = {id(p) for p in model.parameters()}
    stale = sum(
        1 for group in optimizer.param_groups for p in group["params"] if id(p) not in current
    )
    if stale:
        raise ParallelError(
            f"the optimizer holds {stale} parameter(s) the wrapped model does not use: it was "
            "built before the model was wrapped (fully_shard replaces parameters); build the "
            "optimizer from the wrapped model"
        )


def syncs_every_microbatch(context: ParallelContext, section: Any) -> bool:
    """Return whether gradients are reduced after every microbatch instead of once per step.

    FSDP2 reduce-scatters every microbatch unless parallel.fsdp_sync_each_microbatch is false:
    each rank then accumulates only its gradient shard, the memory FSDP2 is chosen for (deferring
    keeps the whole unsharded gradient on every rank). DDP defers: its gradients are whole on
    every rank either way, so reducing once only saves communication.
    """
    section = resolve_section(section, "parallel")
    return context.mode == "fsdp" and section.fsdp_sync_each_microbatch


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Within the block, skip (enabled=False) or do the cross-rank gradient reduction of a DDP or
    FSDP2 model's backward; a plain model is unaffected.
    """
    if enabled:
        yield
    elif isinstance(model, nn.parallel.DistributedDataParallel):
        with model.no_sync():
            yield
    elif callable(getattr(model, "set_requires_gradient_sync", None)):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


def total_norm(norm: torch.Tensor) -> float:
    """Return a gradient norm as a float, gathering it when FSDP2 computed it as a DTensor."""
    full = getattr(norm, "full_tensor", None)
    return float(full() if callable(full) else norm)


__all__ = [
    "SINGLE",
    "ParallelContext",
    "ParallelError",
    "agent_store",
    "check_batch_split",
    "check_optimizer_after_wrapping",
    "check_world_size",
    "elastic_restarts",
    "gradient_sync",
    "init_parallel",
    "launched_world_size",
    "model_class_name",
    "resolve_backend",
    "shutdown_parallel",
    "syncs_every_microbatch",
    "torchrun_worker",
    "total_norm",
    "transformer_blocks",
    "unwrap_model",
    "wrap_model",
]
