"""A torchrun worker for the distributed Muon tests: checks replicated and sharded Muon against
single-process Muon on every rank and writes what it measured.

    torchrun --nproc-per-node 2 tests/speedtronic-optim/distributed_muon_worker.py OUT_DIR

Each rank computes the single-process reference itself (Muon with distributed=False on plain
tensors), so one spawned run checks everything; tests/speedtronic-optim/test_distributed_muon.py
reads OUT_DIR/rank<r>.json. Needs torch and speedtronic_optim only.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

from speedtronic_optim import (
    CautiousOptimizer,
    HybridOptimizer,
    Muon,
    build_optimizer,
    route_parameters,
)
from speedtronic_optim.distributed_muon import shard_rows

F32 = torch.float32

# Uneven on purpose: odd rows, a one-row matrix (rank 1's shard is empty), repeated shapes.
SHAPES = [(16, 16), (24, 8), (8, 24), (16, 16), (5, 12), (1, 8), (16, 16), (12, 5)]
STEPS = 3
# name: (Muon settings, parameter dtype)
VARIANTS: dict[str, tuple[dict, torch.dtype]] = {
    "fp32": (dict(weight_decay=0.1, adjust_lr="match_rms_adamw", ns_dtype=torch.float32), F32),
    "muon_plus": (dict(muon_plus=True, nesterov=False, weight_decay=0.05), F32),
    "polar_express": (dict(ns_coefficients="polar_express"), F32),
    "bf16_work": (dict(ns_dtype=torch.bfloat16, ns_method="standard", weight_decay=0.1), F32),
    "bf16_params": (dict(ns_dtype=torch.bfloat16, ns_method="standard"), torch.bfloat16),
    "fp16_params": (dict(ns_dtype=torch.bfloat16, ns_method="standard"), torch.float16),
}


def data() -> tuple[list[torch.Tensor], list[list[torch.Tensor | None]]]:
    """Start matrices and per-step gradients, the same on every rank (one seed)."""
    generator = torch.Generator().manual_seed(7)
    starts = [torch.randn(*shape, generator=generator) for shape in SHAPES]
    grads: list[list[torch.Tensor | None]] = [
        [torch.randn(*shape, generator=generator) for shape in SHAPES] for _ in range(STEPS)
    ]
    grads[1][2] = None  # a matrix without a gradient in one step is skipped
    return starts, grads


def train(
    make: Callable[[list[dict]], torch.optim.Optimizer],
    wrap: Callable[[torch.Tensor], torch.Tensor],
    steps: int = STEPS,
    dtype: torch.dtype = F32,
) -> tuple[list[torch.Tensor], torch.optim.Optimizer]:
    """Step an optimizer over the shared data; `wrap` makes each tensor a replica or a shard."""
    starts, grads = data()
    params = [torch.nn.Parameter(wrap(start.to(dtype))) for start in starts]
    # Two groups with different learning rates.
    optimizer = make([{"params": params[:5]}, {"params": params[5:], "lr": 0.01}])
    for step_grads in grads[:steps]:
        for param, grad in zip(params, step_grads, strict=True):
            param.grad = None if grad is None else wrap(grad.to(dtype))
        optimizer.step()
    return params, optimizer


def local_part(tensor: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (this rank's part of `like`, the same rows of the plain `tensor`)."""
    if not isinstance(like, DTensor):
        return like.detach(), tensor.detach()
    rows = shard_rows(tensor.shape[0], dist.get_world_size(), dist.get_rank())
    return like.to_local().detach(), tensor.detach()[slice(*rows)]


def max_diff(
    params: list[torch.Tensor], reference: list[torch.Tensor], relative: bool = False
) -> float:
    """Largest |param - reference| over this rank's part (its shards for DTensors); `relative`:
    in units of the dtype's eps * |reference| (about one rounding step, within 2x).
    """
    worst = 0.0
    for param, ref in zip(params, reference, strict=True):
        mine, theirs = local_part(ref, param)
        if not mine.numel():  # a rank's shard of a one-row matrix is empty
            continue
        diff = (mine.float() - theirs.float()).abs()
        if relative:
            tiny = torch.finfo(theirs.dtype).tiny
            diff = diff / (torch.finfo(theirs.dtype).eps * theirs.float().abs().clamp_min(tiny))
        worst = max(worst, diff.max().item())
    return worst


def momentum(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> list[torch.Tensor]:
    return [optimizer.state[param]["momentum_buffer"] for param in params]


def compare(wrap: Callable, settings: dict, dtype: torch.dtype) -> float:
    """Largest difference in parameters and momentum after STEPS steps vs one process (16-bit
    parameters: relative to their rounding step). `settings` say how to split (`distributed`).
    """
    plain = lambda t: t  # noqa: E731
    alone = {**settings, "distributed": False}
    reference, ref_opt = train(lambda g: Muon(g, **alone), plain, STEPS, dtype)
    params, optimizer = train(lambda g: Muon(g, **settings), wrap, STEPS, dtype)
    relative = dtype != F32
    return max(
        max_diff(params, reference, relative),
        max_diff(momentum(optimizer, params), momentum(ref_opt, reference), relative),
    )


def transposed_diff(wrap: Callable, settings: dict) -> float:
    """Largest difference between Muon(transposed=True) on matrices stored (in, out), as
    transformers' Conv1D stores them, split as `settings` say, and one-process Muon on the
    (out, in) matrices, transposed: the shape rules (adjust_lr="original", Muon+'s row_col) must
    read the (out, in) view in the split step too.
    """
    shape_dependent = {"lr": 0.02, "adjust_lr": "original", "muon_plus": True, "weight_decay": 0.1}
    flipped, _ = train(
        lambda g: Muon(g, transposed=True, **shape_dependent, **settings),
        lambda t: wrap(t.mT.contiguous()),
    )
    reference, _ = train(lambda g: Muon(g, distributed=False, **shape_dependent), lambda t: t)
    return max_diff(flipped, [matrix.mT for matrix in reference])


def counting(optimizer: Muon, seen: dict[str, int]) -> Muon:
    """Count in `seen` the matrices this rank orthogonalizes (wraps Muon's Newton–Schulz)."""
    polar = optimizer._polar

    def counted(group, directions):
        seen["matrices"] = seen.get("matrices", 0) + len(directions)
        return polar(group, directions)

    optimizer._polar = counted
    return optimizer


def replicated_checks(seen: dict) -> None:
    """DDP: plain replicas with the same gradients on every rank (distributed=True says so)."""
    plain = lambda t: t  # noqa: E731
    for name, (settings, dtype) in VARIANTS.items():
        seen[f"ddp_{name}_diff"] = compare(
            plain, {"lr": 0.02, "distributed": True, **settings}, dtype
        )
    reference, _ = train(lambda g: Muon(g, distributed=False, lr=0.02), plain)
    seen["moved"] = max_diff(reference, data()[0])  # the steps are real
    seen["ddp_transposed_diff"] = transposed_diff(plain, {"distributed": True})
    # How many matrices each rank orthogonalizes: about half when told the parameters are
    # replicas; all of them otherwise (a process group alone does not make them replicas).
    for label, distributed in (("split", True), ("auto", None), ("all", False)):
        counts: dict[str, int] = {}
        train(lambda g, d=distributed, c=counts: counting(Muon(g, distributed=d), c), plain, 1)
        seen[f"ddp_orthogonalized_{label}"] = counts["matrices"]
    params, optimizer = train(
        lambda g: CautiousOptimizer(Muon(g, distributed=True, lr=0.02)), plain
    )
    reference, _ = train(lambda g: CautiousOptimizer(Muon(g, distributed=False, lr=0.02)), plain)
    seen["ddp_cautious_diff"] = max_diff(params, reference)
    seen["ddp_state_entries"] = len(optimizer.state_dict()["state"])


def sharded_checks(seen: dict) -> None:
    """FSDP2-style DTensor parameters and gradients, Shard(0) on a 1-D mesh."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    shard = lambda t: distribute_tensor(t, mesh, [Shard(0)])  # noqa: E731
    for name, (settings, dtype) in VARIANTS.items():
        seen[f"fsdp_{name}_diff"] = compare(shard, {"lr": 0.02, **settings}, dtype)
    seen["fsdp_transposed_diff"] = transposed_diff(shard, {})
    # Up front: every rank holds a sharded momentum for every matrix before any step.
    params = [torch.nn.Parameter(shard(start)) for start in data()[0]]
    fresh = Muon(params, lr=0.02)
    seen["fsdp_upfront_state"] = all(
        isinstance(b, DTensor) and tuple(b.placements) == (Shard(0),)
        for b in momentum(fresh, params)
    )
    keys = sorted(get_optimizer_state_dict(torch.nn.ParameterList(params), fresh)["state"])
    seen["fsdp_state_keys"] = len(keys)
    seen["fsdp_state_keys_equal"] = len({tuple(k) for k in all_gather(keys)}) == 1
    # The collectives of one step: two all-to-alls, no DTensor redistribution.
    for param, grad in zip(params, data()[1][0], strict=True):
        param.grad = shard(grad)
    with CommDebugMode() as comms:
        fresh.step()
    seen["fsdp_step_collectives"] = {str(k): v for k, v in comms.get_comm_counts().items()}
    # Another layout (here: replicated DTensors) is not split: auto warns, True refuses.
    replicate = lambda t: distribute_tensor(t, mesh, [Replicate()])  # noqa: E731
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(lambda g: Muon(g, lr=0.02), replicate, 1)
    seen["fsdp_other_layout_warned"] = any("every rank" in str(w.message) for w in caught)
    try:
        train(lambda g: Muon(g, lr=0.02, distributed=True), replicate, 1)
    except ValueError as error:
        seen["fsdp_other_layout_refused"] = "Shard(0) on a 1-D mesh" in str(error)
    seen["fsdp_cautious_diff"] = max_diff(
        train(lambda g: CautiousOptimizer(Muon(g, lr=0.02)), shard)[0],
        train(lambda g: CautiousOptimizer(Muon(g, distributed=False, lr=0.02)), lambda t: t)[0],
    )


def all_gather(value: object) -> list:
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def checkpoint_checks(seen: dict, out: Path) -> None:
    """DCP: save after 2 steps, load into a fresh optimizer, step 3 equals the uninterrupted run."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    shard = lambda t: distribute_tensor(t, mesh, [Shard(0)])  # noqa: E731
    starts, grads = data()
    uninterrupted, _ = train(lambda g: Muon(g, lr=0.02), shard)
    params, optimizer = train(lambda g: Muon(g, lr=0.02), shard, steps=2)
    holder = torch.nn.ParameterList(params)
    dcp.save({"optimizer": get_optimizer_state_dict(holder, optimizer)}, checkpoint_id=out / "dcp")
    restored = [torch.nn.Parameter(shard(p.detach().full_tensor())) for p in params]
    again = Muon([{"params": restored[:5]}, {"params": restored[5:], "lr": 0.01}], lr=0.02)
    holder = torch.nn.ParameterList(restored)
    state = {"optimizer": get_optimizer_state_dict(holder, again)}
    dcp.load(state, checkpoint_id=out / "dcp")
    set_optimizer_state_dict(holder, again, state["optimizer"])
    for param, grad in zip(restored, grads[2], strict=True):
        param.grad = None if grad is None else shard(grad.clone())
    again.step()
    seen["dcp_resume_diff"] = max_diff(restored, [p.detach().full_tensor() for p in uninterrupted])


class Net(torch.nn.Module):
    """Embedding, two blocks of two linears, head: what FSDP2 and the routing see in a model."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(32, 16)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.Tanh(), torch.nn.Linear(24, 16))
            for _ in range(2)
        )
        self.head = torch.nn.Linear(16, 32)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def fully_sharded_checks(seen: dict) -> None:
    """build_optimizer (hybrid, cautious) on a fully_shard model steps like one process.

    The one-process twin is fed the FSDP2 run's gathered gradients: a gradient summed in another
    order differs in rounding, which Newton-Schulz amplifies (measured 1e-5 after one step).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    section = type("Section", (), {"name": "muon", "lr": 0.01, "cautious": True})()
    tokens = torch.randint(0, 32, (4, 8), generator=torch.Generator().manual_seed(3))
    torch.manual_seed(0)
    model = Net()
    torch.manual_seed(0)
    twin = Net()
    start = [param.detach().clone() for param in twin.parameters()]
    mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = build_optimizer(model, section)
    routing = route_parameters(twin)
    reference = CautiousOptimizer(
        HybridOptimizer(
            routing.muon, routing.adamw, muon_lr=0.01, adamw_lr=0.01, muon_distributed=False
        )
    )
    batch = tokens.chunk(world)[rank]
    for _ in range(STEPS):
        optimizer.zero_grad()
        logits = model(batch)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.flatten()).backward()
        for param, copy in zip(model.parameters(), twin.parameters(), strict=True):
            copy.grad = param.grad.full_tensor()
        optimizer.step()
        reference.step()
    seen["fully_shard_diff"] = max_diff(list(model.parameters()), list(twin.parameters()))
    seen["fully_shard_moved"] = max_diff(list(twin.parameters()), start)


@record  # a failing rank's traceback ends torchrun's summary, where a test's tail shows it
def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    seen: dict = {"world": dist.get_world_size()}
    replicated_checks(seen)
    sharded_checks(seen)
    checkpoint_checks(seen, out)
    fully_sharded_checks(seen)
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(seen, indent=1))
    dist.barrier()  # leave together: a rank exiting first can abort a peer's last gloo operation
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
