"""DumbDiLoCo: communication against DDP, loss against one process, inner-loop overhead of the
lanes.

(a) bytes a worker sends per inner step (commit sizes on the loopback Hub's wire, and the raw
    safetensors payload) against ring all-reduce DDP, 2 * (N - 1) / N * gradient bytes per step;
(b) held-out loss of 2 DiLoCo nodes (master + worker, synchronous rounds through the real
coordinator
    and the loopback Hub: both send at the boundary, the master aggregates, both install the
    result), with the 2.0 defaults and with TUNED outer settings, against one process with the same
    total tokens (twice the batch, the DDP-equivalent), on the repo's stdlib corpus
    (python -m speedtronic prepare data/stdlib);
(c) tokens/s of the inner loop with a worker's asynchronous lanes running against a Hub server in
    another process, against the same loop with no coordinator, interleaved round by round;
(d) the same communication ratio when a node is a data-parallel group: a master node of 2 DDP
    ranks (torchrun, gloo) and a 1-process worker, each node's bytes per inner step on the Hub.

Prints a table and writes tools/bench/results/diloco.json (with --parts, only those parts are
re-measured; the file keeps the others').

Usage: python tools/bench/bench_diloco.py [--steps 960] [--inner-steps 30] [--rounds 20]
[--group-steps 240] [--parts pair lanes multi_rank] [--output PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from speedtronic_config import ParallelConfig
from speedtronic_data.shards import read_shard_tokens, resolve_shards
from speedtronic_diloco import DumbDiLoCoCoordinator
from speedtronic_diloco.hub import HubClient
from speedtronic_diloco.tensors import parse_delta_ref
from speedtronic_diloco.testing.hub_server import HubServer
from speedtronic_diloco.transport import HfApiTransport
from speedtronic_model.model import ReferenceTransformer
from speedtronic_systems.parallel import init_parallel, shutdown_parallel, wrap_model

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results" / "diloco.json"
MODEL = {"vocab_size": 256, "block_size": 64, "n_layer": 2, "n_head": 4, "d_model": 128}
BATCH, LR, SEED = 16, 2e-3, 0
# The paper's outer lr 0.7 / momentum 0.9 and 2.0's reset of AdamW at every round suit rounds of
# hundreds of steps; for 30-step rounds this run also measures a lighter outer step with the inner
# AdamW state kept across rounds (the paper keeps it too; distributed.reset_inner_optimizer: false).
TUNED = {"outer_lr": 0.5, "outer_momentum": 0.5, "reset_inner_optimizer": False}
PARTS = ("pair", "lanes", "multi_rank")


class Text:
    """Random causal windows from the corpus; each node draws from its own generator."""

    def __init__(self, pattern: str) -> None:
        self.tokens = np.concatenate(
            [np.asarray(read_shard_tokens(p)) for p in resolve_shards(pattern)]
        )

    def batch(self, generator: np.random.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        T = MODEL["block_size"]
        starts = generator.integers(0, len(self.tokens) - T - 1, size)
        windows = torch.from_numpy(
            np.stack([self.tokens[s : s + T + 1] for s in starts]).astype(np.int64)
        )
        return windows[:, :-1], windows[:, 1:]


def new_model() -> ReferenceTransformer:
    torch.manual_seed(SEED)  # every node starts from the same weights, as the master's first global
    return ReferenceTransformer(**MODEL)


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: tuple[torch.Tensor, torch.Tensor],
) -> None:
    inputs, labels = batch
    loss = model(inputs, labels=labels)["loss"]
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def held_out_loss(model: torch.nn.Module, val: Text) -> float:
    """Return the mean loss on the same 16 x 16 validation windows for every model."""
    generator = np.random.default_rng(12345)
    model.eval()
    with torch.no_grad():
        losses = [
            float(model(inputs, labels=labels)["loss"])
            for inputs, labels in (val.batch(generator, 16) for _ in range(16))
        ]
    model.train()
    return statistics.fmean(losses)


def section(role: str, node_id: str, url: str, inner_steps: int, **extra: Any) -> SimpleNamespace:
    values = dict(
        role=role,
        node_id=node_id,
        repo_id="bench/diloco",
        endpoint=url,
        inner_steps=inner_steps,
        poll_interval=3600.0,
        retry_initial=0.05,
        retry_max=0.5,
        retry_attempts=6,
        global_wait_timeout=60.0,
        staleness_limit=None,
    )
    values.update(extra)
    return SimpleNamespace(**values)


def client(url: str, cache: Path) -> HubClient:
    return HubClient(
        "bench/diloco", transport=HfApiTransport("bench/diloco", endpoint=url, cache_dir=cache)
    )


# -- (a) + (b): two DiLoCo nodes in lock step against one process with twice the batch -------------
def diloco_pair(
    train: Text,
    val: Text,
    steps: int,
    inner_steps: int,
    work: Path,
    *,
    reset: bool,
    outer_lr: float,
    outer_momentum: float,
) -> dict[str, Any]:
    """Train two nodes in synchronous rounds; reset: clear AdamW's state at every round (the 2.0
    default).
    """
    tag = f"{reset}-{outer_lr}-{outer_momentum}"
    with HubServer() as server:
        nodes = []
        for index, (role, name) in enumerate([("master", "master"), ("worker", "worker-1")]):
            model = new_model()
            coordinator = DumbDiLoCoCoordinator(
                section(
                    role,
                    name,
                    server.url,
                    inner_steps,
                    async_delta_upload=False,
                    async_global_poll=False,
                    reset_inner_optimizer=reset,
                    outer_lr=outer_lr,
                    outer_momentum=outer_momentum,
                ),
                model,
                hub=client(server.url, work / f"cache-{name}-{tag}"),
                state_dir=work / f"state-{tag}" / name,
            )
            coordinator.start()
            nodes.append(
                (
                    coordinator,
                    model,
                    torch.optim.AdamW(model.parameters(), lr=LR),
                    np.random.default_rng(100 + index),
                )
            )
        master = nodes[0][0].master
        for step in range(1, steps + 1):
            for coordinator, model, optimizer, generator in nodes:
                train_step(model, optimizer, train.batch(generator, BATCH))
                if coordinator.after_optimizer_step(model, step):
                    optimizer.state.clear()
            if (
                step % inner_steps == 0
            ):  # synchronous DiLoCo: one round over both deltas, then both install it
                master.sync_once()
                for coordinator, _model, optimizer, _ in nodes:
                    if coordinator.install_latest_global() and reset:
                        optimizer.state.clear()
        global_model = new_model()
        global_model.load_state_dict(nodes[0][0].hub.download_global_state())
        deltas = [
            c for c in server.store.log if any(p.startswith("deltas/worker-1/") for p in c["added"])
        ]
        payload = [len(server.files("bench/diloco", c["oid"])[c["added"][0]]) for c in deltas]
        outer_step = master.outer_step
        for coordinator, *_ in nodes:
            coordinator.stop()
    params = sum(p.numel() * p.element_size() for p in global_model.parameters())
    nodes_n = 2
    ddp_per_step = 2 * (nodes_n - 1) / nodes_n * params
    wire_per_step = sum(c["bytes"] for c in deltas) / steps
    payload_per_step = sum(payload) / steps
    return {
        "global_loss": held_out_loss(global_model, val),
        "outer_steps": outer_step,
        "worker_deltas": len(deltas),
        "param_bytes": params,
        "ddp_bytes_per_step": ddp_per_step,
        "diloco_payload_bytes_per_step": payload_per_step,
        "diloco_wire_bytes_per_step": wire_per_step,
        "payload_ratio_to_ddp": payload_per_step / ddp_per_step,
        "wire_ratio_to_ddp": wire_per_step / ddp_per_step,
    }


def single_process(train: Text, val: Text, steps: int) -> float:
    model = new_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    generator = np.random.default_rng(100)
    for _ in range(steps):
        train_step(
            model, optimizer, train.batch(generator, 2 * BATCH)
        )  # the same total tokens as 2 nodes
    return held_out_loss(model, val)


# -- (d): a node that is a 2-rank DDP group next to a 1-process node -----------------------------
GROUP_RANKS = 2


def train_node(
    coordinator: DumbDiLoCoCoordinator,
    model: torch.nn.Module,
    train: Text,
    steps: int,
    generator: np.random.Generator,
    batch: int,
) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    coordinator.start()
    for step in range(1, steps + 1):
        train_step(model, optimizer, train.batch(generator, batch))
        if coordinator.after_optimizer_step(model, step):
            optimizer.state.clear()
    coordinator.stop()


def group_rank(url: str, data: str, steps: int, inner_steps: int, work: Path) -> None:
    """One rank of the master node (run by torchrun): DDP, the global batch split over ranks."""
    ddp = ParallelConfig(data_parallel="ddp")
    context = init_parallel(ddp, torch.device("cpu"))
    rank, world = context.rank, context.world_size
    model = wrap_model(new_model(), context, ddp)
    coordinator = DumbDiLoCoCoordinator(
        section("master", "master", url, inner_steps, **SYNC_UPLOADS),
        model,
        hub=client(url, work / "cache-group") if rank == 0 else None,
        state_dir=work / "state-group",
        parallel=context,
    )
    generator = np.random.default_rng(200 + rank)
    train_node(coordinator, model, Text(data), steps, generator, BATCH // world)
    del coordinator, model  # DDP's reducer lets go of the group first
    shutdown_parallel(context)


# Every boundary uploads exactly one delta and no node waits for rounds (only for the first
# global model, while torchrun starts the other node): this part counts bytes.
SYNC_UPLOADS = {
    "async_delta_upload": False,
    "max_local_rounds": None,
    "poll_interval": 1.0,
    "global_wait_timeout": 300.0,
}


def worker_node(url: str, data: str, steps: int, inner_steps: int, work: Path) -> None:
    """The 1-process worker node of (d), in its own process so the bench can stop it."""
    worker = DumbDiLoCoCoordinator(
        section("worker", "worker-1", url, inner_steps, **SYNC_UPLOADS),
        new_model(),
        hub=client(url, work / "cache-worker"),
        state_dir=work / "state-worker",
    )
    train_node(worker, worker.model, Text(data), steps, np.random.default_rng(300), BATCH)


def wait_all(processes: dict[str, subprocess.Popen]) -> None:
    """Wait for every process; at the first that fails, stop the others and raise naming it.

    Without this a master node that dies before publishing its first global model would leave the
    worker waiting out global_wait_timeout (300 s) before the bench said anything.
    """
    finished: queue.Queue[tuple[str, int]] = queue.Queue()
    for name, process in processes.items():
        threading.Thread(
            target=lambda n=name, p=process: finished.put((n, p.wait())), daemon=True
        ).start()
    try:
        for _ in processes:
            name, code = finished.get()
            if code != 0:
                raise RuntimeError(f"the {name} failed with exit code {code}; its log is above")
    finally:  # a failure, or the bench itself interrupted: no node is left running
        for process in processes.values():
            process.terminate()  # torchrun passes SIGTERM on to its ranks
        for process in processes.values():
            process.wait()


def multi_rank_nodes(data: str, steps: int, inner_steps: int, work: Path) -> dict:
    """Run the 2-rank master node (torchrun) and a 1-process worker (shards from the folder
    `data`) against one Hub server; return each node's delta bytes per inner step against DDP
    over the two nodes.
    """
    with HubServer() as server:
        node = [server.url, "--data", data, "--group-steps", str(steps)]
        node += ["--inner-steps", str(inner_steps), "--work", str(work)]
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        torchrun += [f"--nproc-per-node={GROUP_RANKS}", __file__, "--group-rank"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        wait_all(
            {
                f"{GROUP_RANKS}-rank master node": subprocess.Popen(torchrun + node, env=env),
                "worker node": subprocess.Popen(
                    [sys.executable, __file__, "--worker-node"] + node, env=env
                ),
            }
        )
        sizes: dict[str, list[int]] = {}
        for commit in server.store.log:
            files = server.files("bench/diloco", commit["oid"])
            for path in commit["added"]:
                if (ref := parse_delta_ref(path)) is not None:
                    sizes.setdefault(ref.node_id, []).append(len(files[path]))
    params = sum(p.numel() * p.element_size() for p in new_model().parameters())
    ddp_per_step = 2 * (2 - 1) / 2 * params  # ring all-reduce between the two nodes
    nodes = {}
    for node, ranks in (("master", GROUP_RANKS), ("worker-1", 1)):
        per_step = sum(sizes[node]) / steps
        nodes[node] = {
            "ranks": ranks,
            "deltas": len(sizes[node]),
            "delta_bytes": sorted(set(sizes[node])),
            "payload_bytes_per_step": per_step,
            "payload_ratio_to_ddp": per_step / ddp_per_step,
        }
    return {"steps": steps, "ddp_bytes_per_step": ddp_per_step, "nodes": nodes}


# -- (c): the inner loop with and without a worker's asynchronous lanes ---------------------------
def timed_loop(
    train: Text, steps: int, coordinator: DumbDiLoCoCoordinator | None
) -> tuple[float, float]:
    """Return (tokens/s, CPU seconds other threads used meanwhile) for steps of the inner loop."""
    model = new_model() if coordinator is None else coordinator.model
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    generator = np.random.default_rng(7)
    batches = [train.batch(generator, BATCH) for _ in range(steps)]  # data outside the timed region
    start = coordinator.local_step if coordinator is not None else 0
    began, cpu, main = time.perf_counter(), time.process_time(), time.thread_time()
    for step in range(start + 1, start + steps + 1):
        train_step(model, optimizer, batches[step - start - 1])
        if coordinator is not None and coordinator.after_optimizer_step(model, step):
            optimizer.state.clear()
    elapsed = time.perf_counter() - began
    others = (time.process_time() - cpu) - (time.thread_time() - main)
    return steps * BATCH * MODEL["block_size"] / elapsed, others


def lane_overhead(train: Text, inner_steps: int, rounds: int, work: Path) -> dict[str, Any]:
    """Alternate short blocks without and with a worker's lanes; the median ratio cancels machine
    drift.
    """
    server = subprocess.Popen(
        [sys.executable, "-m", "speedtronic_diloco.testing.hub_server", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = server.stdout.readline().split()[-1]
        master = DumbDiLoCoCoordinator(
            section("master", "master", url, inner_steps),
            new_model(),
            hub=client(url, work / "lanes-master"),
            state_dir=work / "lanes" / "master",
        )
        master.start()  # publishes outer step 0, then only the worker's lanes run
        master.stop()
        # No rounds run here, so the drift bound would make the worker wait: this measures the lanes
        # alone.
        worker = DumbDiLoCoCoordinator(
            section(
                "worker", "worker-1", url, inner_steps, poll_interval=1.0, max_local_rounds=None
            ),
            new_model(),
            hub=client(url, work / "lanes-worker"),
            state_dir=work / "lanes" / "worker-1",
        )
        worker.start()
        plain, lanes, lane_cpu, lane_time = [], [], 0.0, 0.0
        timed_loop(train, inner_steps, None)  # warm-up
        for _ in range(rounds):
            plain.append(timed_loop(train, 2 * inner_steps, None)[0])
            speed, others = timed_loop(train, 2 * inner_steps, worker)
            lanes.append(speed)
            lane_cpu += others
            lane_time += 2 * inner_steps * BATCH * MODEL["block_size"] / speed
        uploads = worker.counters["uploads"]
        worker.stop()
    finally:
        server.terminate()
        server.wait(10)
    ratios = sorted(a / b for a, b in zip(lanes, plain, strict=True))
    quartiles = statistics.quantiles(ratios, n=4)
    return {
        "plain_tokens_per_s": statistics.median(plain),
        "lanes_tokens_per_s": statistics.median(lanes),
        "slowdown": 1 - statistics.median(ratios),
        "ratio_quartiles": [quartiles[0], quartiles[2]],
        "rounds": rounds,
        "lane_cpu_per_training_s": lane_cpu / lane_time,
        "uploads": uploads,
    }


def measure_pair(args: argparse.Namespace, train: Text, val: Text, work: Path) -> dict[str, Any]:
    """(a) and (b): communication and held-out loss of two 1-process nodes."""
    pair = diloco_pair(
        train, val, args.steps, args.inner_steps, work, reset=True, outer_lr=0.7, outer_momentum=0.9
    )
    tuned = diloco_pair(
        train,
        val,
        args.steps,
        args.inner_steps,
        work,
        reset=TUNED["reset_inner_optimizer"],
        outer_lr=TUNED["outer_lr"],
        outer_momentum=TUNED["outer_momentum"],
    )
    single = single_process(train, val, args.steps)
    keys = (
        "param_bytes",
        "ddp_bytes_per_step",
        "diloco_payload_bytes_per_step",
        "diloco_wire_bytes_per_step",
        "payload_ratio_to_ddp",
        "wire_ratio_to_ddp",
        "worker_deltas",
    )
    return {
        "steps": args.steps,
        "communication": {k: pair[k] for k in keys},
        "loss": {
            "diloco_2_nodes": pair["global_loss"],
            "single_process_same_tokens": single,
            "relative_gap": pair["global_loss"] / single - 1,
            "outer_steps": pair["outer_steps"],
            "diloco_2_nodes_tuned": tuned["global_loss"],
            "tuned": TUNED,
            "relative_gap_tuned": tuned["global_loss"] / single - 1,
        },
    }


def print_pair(result: dict[str, Any]) -> None:
    c, loss = result["communication"], result["loss"]
    print(f"{'DDP all-reduce bytes / step / worker':<46}{c['ddp_bytes_per_step']:>14,.0f}")
    print(
        f"{'DiLoCo payload bytes / inner step / worker':<46}"
        f"{c['diloco_payload_bytes_per_step']:>14,.0f}"
    )
    print(f"{'  ratio (expect ~1/inner_steps for N=2)':<46}{c['payload_ratio_to_ddp']:>14.4f}")
    print(
        f"{'DiLoCo wire bytes (base64 inline) / step':<46}{c['diloco_wire_bytes_per_step']:>14,.0f}"
    )
    print(f"{'held-out loss, 2 DiLoCo nodes':<46}{loss['diloco_2_nodes']:>14.4f}")
    print(
        f"{'held-out loss, 1 process, same tokens':<46}{loss['single_process_same_tokens']:>14.4f}"
    )
    print(f"{'  relative gap, 2.0 defaults':<46}{loss['relative_gap']:>14.2%}")
    print(f"{'held-out loss, 2 DiLoCo nodes, tuned':<46}{loss['diloco_2_nodes_tuned']:>14.4f}")
    print(f"{'  relative gap, tuned (goal <= 3%)':<46}{loss['relative_gap_tuned']:>14.2%}")


def print_lanes(lanes: dict[str, Any]) -> None:
    print(f"{'inner-loop slowdown from async lanes (<= 2%)':<46}{lanes['slowdown']:>14.2%}")
    low, high = lanes["ratio_quartiles"]
    print(f"{'  lanes/plain ratio, interquartile range':<46}{f'{low:.3f}-{high:.3f}':>14}")
    print(f"{'  lane threads CPU s per training s':<46}{lanes['lane_cpu_per_training_s']:>14.3f}")


def print_multi_rank(multi: dict[str, Any]) -> None:
    print(f"{'2 nodes: master = 2 DDP ranks, worker = 1':<46}{multi['steps']:>8} steps")
    for name, node in multi["nodes"].items():
        label = f"  {name} ({node['ranks']} rank(s)): bytes / step, ratio"
        print(
            f"{label:<46}{node['payload_bytes_per_step']:>14,.0f}"
            f"{node['payload_ratio_to_ddp']:>10.4f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=960, help="local steps per DiLoCo node")
    parser.add_argument("--inner-steps", type=int, default=30)
    parser.add_argument(
        "--rounds", type=int, default=20, help="interleaved block pairs for the overhead ratio"
    )
    parser.add_argument(
        "--group-steps", type=int, default=240, help="local steps per node in (d), multi_rank"
    )
    parser.add_argument(
        "--parts", nargs="+", choices=PARTS, default=list(PARTS), help="what to measure"
    )
    parser.add_argument("--data", default=str(ROOT / "data" / "stdlib"))
    parser.add_argument("--output", default=str(RESULTS))
    # Internal: (d) starts its worker node and, through torchrun, each rank of its 2-rank node
    # with these.
    parser.add_argument("--group-rank", metavar="HUB_URL", help=argparse.SUPPRESS)
    parser.add_argument("--worker-node", metavar="HUB_URL", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)  # the lanes' threads compete for the cores a real run would have
    pattern = str(Path(args.data) / "train_*.bin")
    if args.group_rank:
        group_rank(args.group_rank, pattern, args.group_steps, args.inner_steps, Path(args.work))
        return
    if args.worker_node:
        worker_node(args.worker_node, pattern, args.group_steps, args.inner_steps, Path(args.work))
        return
    if not list(Path(args.data).glob("train_*.bin")):
        sys.exit(f"no shards in {args.data}: run `python -m speedtronic prepare {args.data}` first")
    train, val = Text(pattern), Text(str(Path(args.data) / "val_*.bin"))
    output = Path(args.output)
    # Parts not measured this time keep their earlier results.
    result = json.loads(output.read_text()) if output.exists() else {}
    result.update(
        benchmark="diloco",
        machine=platform.platform(),
        cpus=os.cpu_count(),
        torch_threads=torch.get_num_threads(),
        model=MODEL,
        batch=BATCH,
        inner_steps=args.inner_steps,
    )
    print(f"{'metric':<46}{'value':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if "pair" in args.parts:
            result.update(measure_pair(args, train, val, work))
            print_pair(result)
        if "lanes" in args.parts:
            result["lanes"] = lane_overhead(train, args.inner_steps, args.rounds, work)
            print_lanes(result["lanes"])
        if "multi_rank" in args.parts:
            result["multi_rank"] = multi_rank_nodes(
                args.data, args.group_steps, args.inner_steps, work
            )
            print_multi_rank(result["multi_rank"])
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
