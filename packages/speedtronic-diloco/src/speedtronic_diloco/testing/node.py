"""A tiny DiLoCo node (linear regression) for multi-process trials against a Hub or shared folder.

    python -m speedtronic_diloco.testing.node --role master --node-id master --endpoint URL \
        --repo org/run --steps 40 --inner-steps 4 --summary master.json [--until-outer-step 6]

It prints nothing secret and writes a JSON summary: counters, the last installed outer step, the
master's ledger and the held-out loss of the published global model.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from speedtronic_diloco.diloco import DumbDiLoCoCoordinator
from speedtronic_diloco.hub import HubError, build_hub_client

FEATURES = 8


def target_weight() -> torch.Tensor:
    """Return the weight every node regresses towards (the same in every process)."""
    return torch.linspace(-2.0, 2.0, FEATURES).unsqueeze(0)


def held_out_loss(weight: torch.Tensor) -> float:
    """Return the mean squared error of weight on a fixed held-out batch."""
    x = torch.randn(512, FEATURES, generator=torch.Generator().manual_seed(12345))
    return float(torch.nn.functional.mse_loss(x @ weight.T, x @ target_weight().T))


def run_node(args: argparse.Namespace) -> dict[str, Any]:
    """Train one node for args.steps local steps under DiLoCo and return its summary."""
    section = SimpleNamespace(
        role=args.role,
        node_id=args.node_id,
        repo_id=args.repo,
        endpoint=args.endpoint,
        transport=args.transport,
        inner_steps=args.inner_steps,
        poll_interval=args.poll_interval,
        retry_initial=0.05,
        retry_max=0.5,
        retry_attempts=10,
        global_wait_timeout=60.0,
        async_delta_upload=True,
        async_global_poll=True,
        staleness_limit=args.staleness_limit,
    )
    torch.manual_seed(args.seed)
    model = torch.nn.Linear(FEATURES, 1, bias=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    coordinator = DumbDiLoCoCoordinator(
        section, model, state_dir=Path(args.state_dir) / args.node_id
    )
    coordinator.start()
    generator = torch.Generator().manual_seed(1000 + args.seed)
    for step in range(coordinator.local_step + 1, coordinator.local_step + args.steps + 1):
        x = torch.randn(32, FEATURES, generator=generator)
        loss = torch.nn.functional.mse_loss(model(x), x @ target_weight().T)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if coordinator.after_optimizer_step(model, step):
            optimizer.state.clear()
        time.sleep(args.step_delay)
    if coordinator.master is not None:
        deadline = time.monotonic() + args.linger
        while coordinator.master.outer_step < args.until_outer_step and time.monotonic() < deadline:
            try:
                coordinator.master.sync_once()
            except HubError as exc:  # the Hub is down for a moment: keep lingering
                print(f"outer round failed: {exc}", file=sys.stderr)
            time.sleep(args.poll_interval)
    coordinator.stop()
    summary: dict[str, Any] = {
        "node_id": args.node_id,
        "role": args.role,
        "counters": coordinator.counters,
        "last_global_step": coordinator.last_global_step,
        "local_step": coordinator.local_step,
    }
    if coordinator.master is not None:
        summary["outer_step"] = coordinator.master.outer_step
        summary["processed"] = sorted(coordinator.master.processed_filenames)
        summary["master_counters"] = coordinator.master.counters
        hub = build_hub_client(section)
        summary["global_loss"] = held_out_loss(hub.download_global_state()["weight"])
        summary["initial_loss"] = held_out_loss(_initial_weight(args.seed))
    return summary


def _initial_weight(seed: int) -> torch.Tensor:
    """Return the weight a node initialises with for seed (the master's is the first global)."""
    torch.manual_seed(seed)
    return torch.nn.Linear(FEATURES, 1, bias=False).weight.detach()


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run the node and write its summary."""
    parser = argparse.ArgumentParser(description="A tiny DiLoCo node for multi-process trials.")
    parser.add_argument("--role", choices=["master", "worker"], required=True)
    parser.add_argument("--node-id", required=True)
    parser.add_argument(
        "--endpoint", required=True, help="Hub URL, or a folder with --transport filesystem"
    )
    parser.add_argument("--transport", choices=["hub", "filesystem"], default="hub")
    parser.add_argument("--repo", default="org/diloco-trial")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--inner-steps", type=int, default=4)
    parser.add_argument("--poll-interval", type=float, default=0.2)
    parser.add_argument("--step-delay", type=float, default=0.02)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--staleness-limit", type=int, default=None)
    parser.add_argument(
        "--until-outer-step", type=int, default=0, help="master: keep aggregating until this step"
    )
    parser.add_argument(
        "--linger", type=float, default=30.0, help="master: at most this long after training"
    )
    parser.add_argument("--state-dir", default=".speedtronic/diloco-trial")
    parser.add_argument("--summary", required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    Path(args.summary).write_text(json.dumps(run_node(args), indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
