"""A torchrun worker for test_group.py: one DiLoCo worker node that is a 2-rank DDP or FSDP2 group.

    torchrun --nproc-per-node 2 tests/speedtronic-diloco/group_worker.py MODE HUB_URL OUT_DIR

The node joins repository org/run (where the test's 1-process master published outer step 0),
trains 6 steps with a boundary at step 4 (where it waits for the master's outer step 1), then
starts a second coordinator against org/other, whose global model has other shapes. Each rank
writes OUT_DIR/rank<r>.pt: its full parameters at each point, the steps it reset at, what it
raised.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record

from speedtronic_config import ParallelConfig
from speedtronic_diloco.diloco import DumbDiLoCoCoordinator
from speedtronic_diloco.hub import HubClient
from speedtronic_diloco.transport import HfApiTransport
from speedtronic_systems.parallel import init_parallel, shutdown_parallel, wrap_model

INNER_STEPS = 4
STEPS = 6
TRUE_W = torch.tensor([[1.5, -2.0, 0.5, 3.0]])


class Net(nn.Module):
    """Two blocks (FSDP2 shards each) and a head."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, width), nn.Linear(width, 4)])
        self.head = nn.Linear(4, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def net(seed: int, width: int = 4) -> Net:
    torch.manual_seed(seed)
    return Net(width)


def settings(**overrides) -> SimpleNamespace:
    values = dict(
        role="worker",
        node_id="group",
        repo_id="org/run",
        inner_steps=INNER_STEPS,
        poll_interval=0.05,
        outer_lr=0.7,
        outer_momentum=0.9,
        async_delta_upload=False,
        async_global_poll=False,
        global_wait_timeout=120.0,
        max_local_rounds=1,  # wait at the boundary for the master's next outer step
        staleness_limit=None,
    )
    values.update(overrides)
    return SimpleNamespace(**values)


def client(url: str, repo_id: str, cache: Path) -> HubClient:
    transport = HfApiTransport(repo_id, endpoint=url, cache_dir=cache)
    # Quick retries, but for about 2 s in all: the loopback server shares two loaded CI cores.
    return HubClient(
        repo_id, transport=transport, retry_initial=0.01, retry_max=0.5, retry_attempts=10
    )


def full(model: nn.Module) -> dict[str, torch.Tensor]:
    """Return the whole model's state on every rank (FSDP2 shards gathered)."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


@record  # a failing rank's traceback ends torchrun's summary, where a test's tail shows it
def main(mode: str, url: str, out: Path) -> None:
    section = ParallelConfig(data_parallel=mode)
    context = init_parallel(section, torch.device("cpu"))  # gloo, as the trainer joins it
    rank = context.rank
    model = wrap_model(net(seed=1), context, section)
    lead = rank == 0
    coordinator = DumbDiLoCoCoordinator(
        settings(),
        model,
        hub=client(url, "org/run", out / "cache") if lead else None,
        state_dir=out / "state",
        parallel=context,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    coordinator.start()
    seen: dict = {"after_start": full(model), "resets": []}
    generator = torch.Generator().manual_seed(10 + rank)  # each rank its own data
    for step in range(1, STEPS + 1):
        x = torch.randn(8, 4, generator=generator)
        loss = nn.functional.mse_loss(model(x), x @ TRUE_W.T)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == INNER_STEPS:
            seen["at_boundary"] = full(model)
        if coordinator.after_optimizer_step(model, step):
            optimizer.state.clear()
            seen["resets"].append(step)
        if step == INNER_STEPS:
            seen["after_boundary"] = full(model)
    coordinator.stop()
    seen["state"] = coordinator.state_dict()
    seen["built_hub"] = coordinator.hub is not None
    seen["last_global_step"] = coordinator.last_global_step
    other = DumbDiLoCoCoordinator(
        settings(repo_id="org/other"),
        model,
        hub=client(url, "org/other", out / "cache-other") if lead else None,
        state_dir=out / "state-other",
        parallel=context,
    )
    try:
        other.start()
        seen["error"] = None
    except Exception as exc:
        seen["error"] = type(exc).__name__
    dist.barrier()  # every rank is still in step with the others after the failure
    torch.save(seen, out / f"rank{rank}.pt")
    del model, optimizer, coordinator, other  # DDP's reducer lets go of the group first
    shutdown_parallel(context)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
    # Skip interpreter finalization, as tests/speedtronic's workers do: an FSDP2 group outlives
    # shutdown_parallel (DTensor's caches keep its device mesh), and a gloo thread still
    # freeing a collective's tensors there aborts the rank ("terminate called without an active
    # exception"). The results are written by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
