"""Data parallelism: measured tokens/s at world size 1 and 2, the real program's collectives per
step, measured collective costs, and a scaling MODEL (not a measurement) for DDP, FSDP and DiLoCo
at 8 to 1,024 ranks.

(a) Measured: configs/quickstart.yaml's model (4 layers, d_model 128, 128 tokens, byte vocab;
    4.3 MB of fp32 weights), optimizer (Muon) and global batch (16 sequences, as microbatches of
    8) on synthetic tokens, trained through speedtronic.runtime.build_runtime at world 1
    (parallel.data_parallel none) and world 2 (ddp, fsdp; gloo; torchrun), one torch thread per
    process, interleaved round by round: median tokens/s of the global batch (wall clock) and
    tokens per CPU second (summed over ranks), each as the median per-round ratio to world 1.
    World 2 runs two processes on 2 cores where world 1 runs one, so its wall-clock ratio is
    not a parallel speedup; the CPU ratio is the cost of the split and the collectives.
(b) Counted: the third optimizer step (Trainer.fit) of the same trainer at a simulated world
    size, in one process, on a counting process group: a Python ProcessGroup registered as a
    torch.distributed backend that records every collective DDP's reducer, FSDP2, DTensor and
    the trainer issue (kind, payload bytes) and returns its input. Per-rank batch 16 (weak
    scaling), at world 2 and every size of the model, for DDP, FSDP and FSDP with AdamW.
(c) Measured: gloo all_reduce, all_gather_single and reduce_scatter_single at world 2 over
    message sizes, fitted as t = a + b * bytes and turned into a per-ring-step latency alpha and
    a link bandwidth beta.
(d) MODEL: per-step time at 8-1,024 ranks = compute (the measured world-1 CPU seconds per step)
    plus the counted collectives costed as ring algorithms (all-reduce 2(W-1) steps and
    2(W-1)/W of the payload per rank, all-gather / reduce-scatter W-1 steps and (W-1)/W), no
    overlap with compute, on three links: this machine's measured loopback, an ASSUMED
    datacenter link and an ASSUMED WAN. A DiLoCo node communicates once per inner_steps: it
    uploads one model-sized delta and downloads the new global model, and the master downloads
    the other W-1 deltas through its one link.

Prints the tables and writes tools/bench/results/parallel.json. The full run took 15 minutes on
2 cores at load average 17; --quick (one round of 3 steps, counts at world 8 only, 3 message
sizes) 41 CPU seconds, 2.5 minutes of wall clock at load 18.

Usage: python tools/bench/bench_parallel.py [--quick] [--rounds 5] [--steps 20]
       [--inner-steps 500] [--compute-s SECONDS] [--output PATH]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "parallel.json"
# configs/quickstart.yaml's model, optimizer and global batch; microbatches of 8 so that world 2
# splits the batch with one microbatch per rank.
MODEL = {
    "name": "reference_transformer",
    "vocab_size": 256,
    "max_seq_len": 128,
    "n_layer": 4,
    "n_head": 4,
    "d_model": 128,
}
MICRO_BATCH, BATCH = 8, 16
WORLDS = (8, 16, 64, 256, 1024)
MEASURED_KINDS = ("all_reduce", "all_gather", "reduce_scatter")
# The programs whose collectives are counted: name -> (parallel.data_parallel, optimizer). Muon is
# the quickstart's; FSDP with AdamW shows what FSDP itself costs without Muon's DTensor traffic.
PROGRAMS = {"ddp": ("ddp", "muon"), "fsdp": ("fsdp", "muon"), "fsdp_adamw": ("fsdp", "adamw")}


@dataclass(frozen=True)
class Link:
    """A network as the cost model sees it: seconds per ring step, bytes per second per rank."""

    alpha: float
    beta: float


# ASSUMED links (not measured here): a 100 Gb/s datacenter NIC per rank with 5 us per hop, and a
# 1 Gb/s WAN with 50 ms per transfer, the setting DiLoCo is meant for.
DATACENTER = Link(alpha=5e-6, beta=12.5e9)
WAN = Link(alpha=0.05, beta=125e6)


# -- the cost model: pure functions --------------------------------------------------------------
def ring_steps(kind: str, world: int) -> int:
    """Return the sequential message steps of the ring algorithm for one collective."""
    if world <= 1:
        return 0
    return 2 * (world - 1) if kind == "all_reduce" else world - 1


def wire_fraction(kind: str, world: int) -> float:
    """Return the bytes each rank sends per payload byte (payload: the full tensor for
    all-reduce and broadcast, the gathered output or the scattered input otherwise).
    """
    if world <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2 * (world - 1) / world
    if kind == "broadcast":
        return 1.0  # a pipelined ring forwards the whole tensor once
    return (world - 1) / world


def collective_time(kind: str, calls: int, payload: float, world: int, link: Link) -> float:
    """Return the seconds `calls` ring collectives moving `payload` bytes in all take."""
    return calls * ring_steps(kind, world) * link.alpha + (
        wire_fraction(kind, world) * payload / link.beta
    )


def fit_latency_bandwidth(points: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """Return (a, b) of t = a + b * x fitted to (x, t) points by least relative error, so the
    small messages (latency) count as much as the large ones (bandwidth).
    """
    points = list(points)
    if len({x for x, _ in points}) < 2:
        raise ValueError("need at least two distinct message sizes to fit latency and bandwidth")
    s00 = s01 = s11 = r0 = r1 = 0.0
    for x, t in points:
        w = 1.0 / (t * t)
        s00, s01, s11 = s00 + w, s01 + w * x, s11 + w * x * x
        r0, r1 = r0 + w * t, r1 + w * x * t
    det = s00 * s11 - s01 * s01
    return (r0 * s11 - r1 * s01) / det, (s00 * r1 - s01 * r0) / det


def link_from_fit(kind: str, a: float, b: float, world: int = 2) -> Link:
    """Return the per-ring-step latency and link bandwidth behind a fit made at `world` ranks."""
    if b <= 0:
        raise ValueError(f"no bandwidth resolved: time does not grow with size (slope {b:g})")
    return Link(alpha=max(a, 0.0) / ring_steps(kind, world), beta=wire_fraction(kind, world) / b)


def comm_time(counts: dict[str, tuple[int, float]], world: int, links: dict[str, Link]) -> float:
    """Return the seconds per step of a step's collectives ({kind: (calls, payload bytes)})."""
    return sum(
        collective_time(kind, calls, payload, world, links.get(kind, links["all_gather"]))
        for kind, (calls, payload) in counts.items()
    )


def wire_bytes(counts: dict[str, tuple[int, float]], world: int) -> float:
    """Return the bytes one rank sends per step for a step's collectives."""
    return sum(wire_fraction(kind, world) * payload for kind, (_, payload) in counts.items())


def diloco_round_time(param_bytes: float, world: int, link: Link) -> float:
    """Return one synchronous DiLoCo round's seconds: a worker's delta upload, the master's
    download of the other W-1 deltas through its one link, its upload of the new global model,
    and a worker's download of it.
    """
    if world <= 1:
        return 0.0
    return 4 * link.alpha + (world + 2) * param_bytes / link.beta


def counts_for_model(
    counted: dict[str, dict[int, dict[str, Any]]], worlds: Sequence[int] = WORLDS
) -> tuple[dict[str, dict[int, dict[str, tuple[int, float]]]], dict[str, dict[int, Any]]]:
    """Return the counts the model uses at each world size and, where a size was not counted or
    the program failed there, a note: such a size borrows the counts of the largest counted size
    below it (else the smallest) that ran.
    """
    used: dict[str, dict[int, dict[str, tuple[int, float]]]] = {}
    notes: dict[str, dict[int, Any]] = {}
    for program, by_world in counted.items():
        ran = sorted(w for w, step in by_world.items() if "error" not in step)
        if not ran:
            raise ValueError(f"{program} failed at every counted world size")
        used[program] = {}
        for world in worlds:
            step = by_world.get(world)
            if step is not None and "error" not in step:
                used[program][world] = step
                continue
            source = max((w for w in ran if w <= world), default=ran[0])
            used[program][world] = by_world[source]
            notes.setdefault(program, {})[world] = {
                "counts_from_world": source,
                "error": step["error"] if step is not None else None,
            }
    return used, notes


def scaling_rows(
    counts: dict[str, dict[int, dict[str, tuple[int, float]]]],
    param_bytes: float,
    compute_s: float,
    inner_steps: int,
    links: dict[str, dict[str, Link]],
    worlds: Sequence[int] = WORLDS,
) -> list[dict[str, Any]]:
    """Return the model's rows: per world size and scheme, traffic and, per link, the step time
    (compute plus communication, no overlap) and the efficiency compute / step time.
    """
    rows = []
    for world in worlds:
        for scheme in [*counts, "diloco"]:
            row: dict[str, Any] = {"world": world, "scheme": scheme}
            if scheme == "diloco":
                row["calls_per_step"] = 2 / inner_steps
                row["wire_bytes_per_step"] = 2 * param_bytes / inner_steps
            else:
                step = counts[scheme][world]
                row["calls_per_step"] = sum(calls for calls, _ in step.values())
                row["wire_bytes_per_step"] = wire_bytes(step, world)
            for name, by_kind in links.items():
                if scheme == "diloco":
                    comm = diloco_round_time(param_bytes, world, by_kind["all_gather"])
                    comm /= inner_steps
                else:
                    comm = comm_time(counts[scheme][world], world, by_kind)
                total = compute_s + comm
                row[name] = {
                    "comm_s": comm,
                    "step_s": total,
                    "efficiency": compute_s / total,
                    "efficiency_full_overlap": compute_s / max(compute_s, comm),
                    "tokens_per_s": world * BATCH * MODEL["max_seq_len"] / total,
                }
            rows.append(row)
    return rows


# -- workers: each runs in its own process ---------------------------------------------------------
def run_config(
    mode: str, batch: int, output_dir: str, steps: int, optimizer: str = "muon"
) -> dict[str, Any]:
    """Return the benchmark's training config: quickstart's model and optimizer, synthetic
    tokens, no checkpoints, global batch `batch`.
    """
    return {
        "run": {"device": "cpu", "max_steps": steps, "output_dir": output_dir, "seed": 1234},
        "model": dict(MODEL),
        # num_tokens is the number of synthetic samples, drawn lazily: enough for any run here.
        "data": {
            "num_tokens": 1 << 21,
            "micro_batch_size": MICRO_BATCH,
            "target_batch_size": batch,
        },
        "optimizer": {"name": optimizer, "lr": 2e-3, "weight_decay": 0.0},
        "scheduler": {"name": "wsd", "warmup_steps": 20},
        "checkpoint": {"enabled": False},
        "logging": {"progress": False, "every_steps": 1000},
        "parallel": {"data_parallel": mode},
    }


def train_worker(args: argparse.Namespace) -> None:
    """Train warm-up then timed steps through build_runtime; rank 0 writes tokens/s as JSON."""
    import torch

    from speedtronic import runtime
    from speedtronic_systems.parallel import shutdown_parallel

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        config = run_config(args.mode, BATCH, tmp, args.warmup + args.steps)
        trainer, _ = runtime.build_runtime(config)
        trainer.fit(args.warmup)  # allocator, DDP's bucket rebuild, Muon's buffers
        cpu, tokens = time.process_time(), trainer.tokens  # process time: every thread
        result = trainer.fit(args.warmup + args.steps)
        cpu = trainer.parallel.all_reduce_sum([time.process_time() - cpu])[0]
        trainer.close()
        shutdown_parallel(trainer.parallel)
    if trainer.parallel.is_main:
        record = {
            "tokens_per_s": result.metrics["tokens_per_s"],
            "step_s": result.elapsed_s / result.steps_run,
            "cpu_s_per_step": cpu / result.steps_run,  # summed over the ranks
            "tokens_per_cpu_s": (result.tokens - tokens) / cpu,
        }
        Path(args.out).write_text(json.dumps(record))


def collectives_worker(args: argparse.Namespace) -> None:
    """Time gloo collectives at this world size over message sizes; rank 0 writes the medians."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    results: dict[str, list[tuple[int, float]]] = {kind: [] for kind in MEASURED_KINDS}
    ops = {
        "all_reduce": lambda full, shard: dist.all_reduce(full),
        "all_gather": lambda full, shard: dist.all_gather_single(full, shard),
        "reduce_scatter": lambda full, shard: dist.reduce_scatter_single(shard, full),
    }
    for size in args.sizes:
        full = torch.ones(size // 4)
        shard = torch.ones(size // 4 // world)
        inner = max(1, (1 << 20) // size)  # batch the small ones: the timer and barrier cost
        samples: dict[str, list[float]] = {kind: [] for kind in MEASURED_KINDS}
        for repeat in range(args.repeats + 1):
            for kind in MEASURED_KINDS:  # interleaved, so drift hits every kind alike
                dist.barrier()
                began = time.perf_counter()
                for _ in range(inner):
                    ops[kind](full, shard)
                if repeat:  # the first pass is a warm-up
                    samples[kind].append((time.perf_counter() - began) / inner)
        for kind in MEASURED_KINDS:
            results[kind].append((size, statistics.median(samples[kind])))
    if rank == 0:
        Path(args.out).write_text(json.dumps({"world": world, "times": results}))
    dist.destroy_process_group()


def count_worker(args: argparse.Namespace) -> None:
    """Count the collectives of one optimizer step at each simulated world size; write JSON (an
    error in place of the counts where the real program fails at that size).
    """
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    counting = _counting_group_class()
    dist.Backend.register_backend("counting", counting.create, devices=["cpu"])
    torch.set_num_threads(1)
    out: dict[str, dict[int, Any]] = {program: {} for program in PROGRAMS}
    param_bytes = 0
    for (program, (mode, optimizer)), world in itertools.product(PROGRAMS.items(), args.worlds):
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(world))
        dist.init_process_group("counting", store=FakeStore(), rank=0, world_size=world)
        try:
            param_bytes = _count_step(counting.calls, mode, optimizer, world)
        except Exception as error:  # a failure of the program itself is a result here
            message = f"{type(error).__name__}: {str(error).splitlines()[0]}"
            out[program][world] = {"error": message}
            continue
        finally:
            dist.destroy_process_group()
        step: dict[str, list[float]] = {}
        for kind, payload in counting.calls:
            calls, total = step.get(kind, [0, 0])
            step[kind] = [calls + 1, total + payload]
        out[program][world] = step
    Path(args.out).write_text(json.dumps({"counts": out, "param_bytes": param_bytes}))


def _count_step(calls: list[tuple[str, int]], mode: str, optimizer: str, world: int) -> int:
    """Train 3 steps through build_runtime, leaving the third step's collectives in `calls`;
    return the model's full parameter bytes.
    """
    import torch

    from speedtronic import runtime

    with tempfile.TemporaryDirectory() as tmp:
        config = run_config(mode, BATCH * world, tmp, 3, optimizer)
        trainer, _ = runtime.build_runtime(config)
        # The fake collectives return wrong values (every rank's data is this rank's), which can
        # turn the weights non-finite, and a skipped update would skip the optimizer's
        # collectives: every step starts from the initial weights and a fresh optimizer state.
        initial = [p.detach().clone() for p in trainer.model.parameters()]
        for step in range(1, 4):  # step 2 rebuilds DDP's buckets; step 3 is steady
            with torch.no_grad():
                for param, value in zip(trainer.model.parameters(), initial, strict=True):
                    param.copy_(value)
            trainer.optimizer.state.clear()
            calls.clear()
            trainer.fit(step)
        trainer.close()
    return sum(p.numel() * p.element_size() for p in initial)  # DTensor sizes are global


def _counting_group_class() -> Any:
    """Return a ProcessGroup subclass that records each collective and returns its input."""
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import _create_work_from_future

    def done(value: Any) -> Any:
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(value)
        return _create_work_from_future(future)

    def nbytes(tensors: Any) -> int:
        leaves = torch.utils._pytree.tree_leaves(tensors)
        return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))

    class CountingGroup(dist.ProcessGroup):
        """One rank of a simulated world: no peers, every collective recorded (kind, bytes)."""

        calls: list[tuple[str, int]] = []

        def __init__(self, rank: int, world_size: int) -> None:
            super().__init__(rank, world_size)
            self._rank, self._world = rank, world_size

        @classmethod
        def create(cls, store: Any, rank: int, world_size: int, timeout: Any) -> CountingGroup:
            return cls(rank, world_size)

        @property
        def group_name(self) -> str:  # DeviceMesh names its dimension groups by this
            return dist.distributed_c10d._world.pg_names[self]

        def size(self) -> int:
            return self._world

        def getBackendName(self) -> str:  # noqa: N802 (torch's name)
            return "counting"

        def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
            self.calls.append(("all_reduce", nbytes(tensors)))
            return done(tensors)

        def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
            return self.allreduce(tensors, opts)

        def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
            self.calls.append(("broadcast", nbytes(tensors)))
            return done(tensors)

        def barrier(self, opts: Any = None) -> Any:
            self.calls.append(("barrier", 0))
            return done(None)

        def allgather(
            self, outputs: list[list[torch.Tensor]], inputs: Any, opts: Any = None
        ) -> Any:
            for group, tensor in zip(outputs, inputs, strict=True):
                for output in group:
                    output.copy_(tensor)
            self.calls.append(("all_gather", nbytes(outputs)))
            return done(outputs)

        def all_gather_single(
            self, output: torch.Tensor, shard: torch.Tensor, opts: Any = None
        ) -> Any:
            output.view(self._world, -1).copy_(shard.reshape(1, -1).clone())
            self.calls.append(("all_gather", nbytes(output)))
            return done([output])

        def reduce_scatter_single(
            self, output: torch.Tensor, full: torch.Tensor, opts: Any = None
        ) -> Any:
            output.copy_(full.view(self._world, -1)[self._rank].view_as(output))
            self.calls.append(("reduce_scatter", nbytes(full)))
            return done([output])

        def allgather_into_tensor_coalesced(
            self, outputs: Any, shards: Any, opts: Any = None
        ) -> Any:
            for output, shard in zip(outputs, shards, strict=True):
                self.all_gather_single(output, shard)
            return done(outputs)

        def reduce_scatter_tensor_coalesced(
            self, outputs: Any, fulls: Any, opts: Any = None
        ) -> Any:
            for output, full in zip(outputs, fulls, strict=True):
                self.reduce_scatter_single(output, full)
            return done(outputs)

    return CountingGroup


# -- the orchestration ----------------------------------------------------------------------------
def _python(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads)}


def _worker_args(worker: str, out: Path, **options: Any) -> list[str]:
    args = [__file__, "--worker", worker, "--out", str(out)]
    for name, value in options.items():
        values = value if isinstance(value, list | tuple) else [value]
        args += [f"--{name.replace('_', '-')}", *map(str, values)]
    return args


def _run(command: list[str], env: dict[str, str], out: Path) -> dict[str, Any]:
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not out.exists():
        sys.exit(f"{' '.join(command[:6])}... failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    return json.loads(out.read_text())


def _torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone"] + [
        "--nproc-per-node",
        str(nproc),
    ]


# name: (world size, mode, torch threads per rank). One thread per process: on a shared machine
# several intra-op threads per process spin against the other load (2 threads measured 14 s/step
# against 1.1 s with one at load 15).
CONFIGS = {"world1": (1, "none", 1), "ddp_world2": (2, "ddp", 1), "fsdp_world2": (2, "fsdp", 1)}
REFERENCE = "world1"


def measure_training(rounds: int, steps: int, warmup: int, work: Path) -> dict[str, Any]:
    """Run every config once per round, rotating the order; return per-round and median results."""
    names = list(CONFIGS)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for index in range(rounds):
        order = names[index % len(names) :] + names[: index % len(names)]
        for name in order:
            world, mode, threads = CONFIGS[name]
            out = work / f"train-{name}-{index}.json"
            args = _worker_args(
                "train", out, mode=mode, steps=steps, warmup=warmup, threads=threads
            )
            launcher = _torchrun(world) if world > 1 else [sys.executable]
            record = _run(launcher + args, _python(threads), out)
            record["load_1min"] = os.getloadavg()[0]
            runs[name].append(record)
            print(f"  round {index + 1} {name:<18}{record['tokens_per_s']:>10,.0f} tokens/s")
    summary: dict[str, Any] = {}
    for name in names:

        def ratio(key: str, name: str = name) -> float:
            pairs = zip(runs[name], runs[REFERENCE], strict=True)
            return statistics.median(run[key] / ref[key] for run, ref in pairs)

        def median(key: str, name: str = name) -> float:
            return statistics.median(run[key] for run in runs[name])

        summary[name] = {
            "world": CONFIGS[name][0],
            "mode": CONFIGS[name][1],
            "threads_per_rank": CONFIGS[name][2],
            "tokens_per_s": [run["tokens_per_s"] for run in runs[name]],
            "median_tokens_per_s": median("tokens_per_s"),
            "median_step_s": median("step_s"),
            "median_ratio_to_world1": ratio("tokens_per_s"),
            "median_cpu_s_per_step": median("cpu_s_per_step"),
            "median_tokens_per_cpu_s": median("tokens_per_cpu_s"),
            "median_cpu_ratio_to_world1": ratio("tokens_per_cpu_s"),
            "load_1min": [run["load_1min"] for run in runs[name]],
        }
    return summary


def measure_collectives(sizes: list[int], repeats: int, work: Path) -> dict[str, Any]:
    """Time the collectives at world 2 and fit each kind's latency and bandwidth."""
    out = work / "collectives.json"
    args = _worker_args("collectives", out, sizes=sizes, repeats=repeats)
    measured = _run(_torchrun(2) + args, _python(1), out)
    fits = {}
    for kind, points in measured["times"].items():
        a, b = fit_latency_bandwidth(points)
        link = link_from_fit(kind, a, b)
        fits[kind] = {
            "a_s": a,
            "b_s_per_byte": b,
            "alpha_s": link.alpha,
            "beta_bytes_per_s": link.beta,
        }
    return {"world": measured["world"], "times": measured["times"], "fit": fits}


def count_collectives(worlds: list[int], work: Path) -> tuple[dict[str, Any], float]:
    """Return {program: {world: {kind: (calls, payload bytes)} or {"error": ...}}} and the
    model's parameter bytes.
    """
    out = work / "count.json"
    record = _run([sys.executable, *_worker_args("count", out, worlds=worlds)], _python(1), out)
    counts = {
        program: {
            int(world): step
            if "error" in step
            else {kind: (int(c), float(b)) for kind, (c, b) in step.items()}
            for world, step in by_world.items()
        }
        for program, by_world in record["counts"].items()
    }
    return counts, record["param_bytes"]


def _since(began: float) -> str:
    return f"{time.perf_counter() - began:.0f} s"


def _mb(value: float) -> str:
    return f"{value / 1e6:,.3f}"


def print_tables(result: dict[str, Any]) -> None:
    training, counts = result["measured_training"], result["collectives_per_step"]
    print(f"\nmeasured (load {result['load_1min_start']:.1f} -> {result['load_1min_end']:.1f}):")
    print(
        f"{'config':<13}{'tokens/s':>10}{'ratio':>7}{'step s':>8}{'CPU s/step':>11}"
        f"{'tokens/CPU s':>13}{'ratio':>7}{'wire MB/step/rank':>19}"
    )
    for name, run in training.items():
        step = counts.get(run["mode"], {}).get(2) or counts.get(run["mode"], {}).get(8, {})
        print(
            f"{name:<13}{run['median_tokens_per_s']:>10,.0f}{run['median_ratio_to_world1']:>7.3f}"
            f"{run['median_step_s']:>8.3f}{run['median_cpu_s_per_step']:>11.3f}"
            f"{run['median_tokens_per_cpu_s']:>13,.0f}{run['median_cpu_ratio_to_world1']:>7.3f}"
            f"{_mb(wire_bytes(step, 2)):>19}"
        )
    print("\ncollectives per optimizer step of the real program (per rank; counted, not timed):")
    print(
        f"{'program':<11}{'world':>6}  {'kind':<16}{'calls':>6}{'payload MB':>12}"
        f"{'wire MB/rank':>14}"
    )
    for program, by_world in counts.items():
        for world, step in sorted(by_world.items()):
            if "error" in step:
                print(f"{program:<11}{world:>6}  fails: {step['error'][:120]}")
                continue
            for kind, (calls, payload) in sorted(step.items()):
                wire = wire_fraction(kind, world) * payload
                print(
                    f"{program:<11}{world:>6}  {kind:<16}{calls:>6}{_mb(payload):>12}"
                    f"{_mb(wire):>14}"
                )
    print("\ncollective costs at world 2 (gloo, loopback; measured, fitted):")
    for kind, fit in result["collective_costs"]["fit"].items():
        print(
            f"  {kind:<16} alpha {fit['alpha_s'] * 1e6:8.1f} us/step   "
            f"beta {fit['beta_bytes_per_s'] / 1e9:6.2f} GB/s"
        )
    model = result["model"]
    print(
        f"\nMODEL, NOT MEASUREMENT: compute {model['compute_s']:.3f} s/step per rank (measured at "
        f"world 1), DiLoCo inner_steps {model['inner_steps']}; step s (efficiency) per link"
    )
    links = list(model["links"])
    header = "".join(f"{name:>22}" for name in links)
    print(f"{'world':>6} {'scheme':<12}{'calls/step':>11}{'MB/step/rank':>13}{header}")
    for row in model["rows"]:
        cells = "".join(
            f"{row[name]['step_s']:>13.3f} ({row[name]['efficiency']:>5.1%})" for name in links
        )
        scheme = row["scheme"] + ("*" if row["counts"] else "")
        print(
            f"{row['world']:>6} {scheme:<12}{row['calls_per_step']:>11.3g}"
            f"{_mb(row['wire_bytes_per_step']):>13}{cells}"
        )
    borrowed = {}
    for row in model["rows"]:
        if row["counts"]:
            note = row["counts"]
            why = "fails there" if note["error"] else "not counted"
            key = (row["scheme"], note["counts_from_world"], why)
            borrowed.setdefault(key, []).append(row["world"])
    for (scheme, source, why), worlds in borrowed.items():
        print(f"  * {scheme} at {worlds}: {why}; counts of world {source}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="about a minute: 1 round, fewer sizes")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per training run")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--inner-steps", type=int, default=500, help="DiLoCo H (config default)")
    parser.add_argument(
        "--compute-s", type=float, help="model's compute s/step (default: measured)"
    )
    parser.add_argument("--output", default=str(RESULTS))
    # Internal: the worker processes this script starts.
    parser.add_argument(
        "--worker", choices=("train", "collectives", "count"), help=argparse.SUPPRESS
    )
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--sizes", type=int, nargs="*", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worlds", type=int, nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        {"train": train_worker, "collectives": collectives_worker, "count": count_worker}[
            args.worker
        ](args)
        return
    began, load_start = time.perf_counter(), os.getloadavg()[0]
    if args.quick:
        args.rounds, args.steps, args.warmup = 1, 3, 2
    sizes = [1 << k for k in (range(10, 25, 2) if not args.quick else (10, 16, 22))]
    count_worlds = [2, *WORLDS] if not args.quick else [8]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print(f"training: {args.rounds} round(s) of {args.steps} steps per config")
        training = measure_training(args.rounds, args.steps, args.warmup, work)
        print(f"counting collectives at world sizes {count_worlds} ({_since(began)})")
        counts, param_bytes = count_collectives(count_worlds, work)
        print(f"timing gloo collectives at world 2 ({_since(began)})")
        costs = measure_collectives(sizes, 2 if args.quick else 7, work)
    model_counts, borrowed = counts_for_model(counts)
    # CPU seconds, not wall: on a loaded machine the wall clock also counts waiting for a core.
    compute_s = args.compute_s or training[REFERENCE]["median_cpu_s_per_step"]
    measured_links = {
        kind: Link(fit["alpha_s"], fit["beta_bytes_per_s"]) for kind, fit in costs["fit"].items()
    }
    links = {
        "measured_loopback": measured_links,
        "assumed_datacenter": {kind: DATACENTER for kind in MEASURED_KINDS},
        "assumed_wan": {kind: WAN for kind in MEASURED_KINDS},
    }
    rows = scaling_rows(model_counts, param_bytes, compute_s, args.inner_steps, links)
    for row in rows:
        row["counts"] = borrowed.get(row["scheme"], {}).get(row["world"])
    result = {
        "benchmark": "parallel",
        "machine": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "load_1min_start": load_start,
        "load_1min_end": os.getloadavg()[0],
        "quick": args.quick,
        "seconds": None,
        "model_config": MODEL,
        "optimizer": "muon (quickstart) unless the program's name says otherwise",
        "global_batch": {"sequences": BATCH, "micro_batch": MICRO_BATCH, "tokens": BATCH * 128},
        "data": "synthetic tokens",
        "measured_training": training,
        "programs": {name: {"mode": m, "optimizer": o} for name, (m, o) in PROGRAMS.items()},
        "collectives_per_step": counts,
        "collectives_note": (
            "one steady optimizer step (Trainer.fit, third step) of build_runtime's trainer on a "
            "counting process group at a simulated world size; per-rank batch 16 (2 microbatches "
            "of 8); {kind: [calls, payload bytes]}; payload = full tensor (all-reduce, "
            "broadcast), gathered output (all-gather), scattered input (reduce-scatter)"
        ),
        "param_bytes": param_bytes,
        "collective_costs": costs,
        "model": {
            "label": "MODEL, NOT MEASUREMENT",
            "compute_s": compute_s,
            "compute_source": "--compute-s"
            if args.compute_s
            else f"measured {REFERENCE} CPU s per step (1 thread)",
            "inner_steps": args.inner_steps,
            "links": {
                "measured_loopback": "alpha/beta fitted to gloo at world 2 on this machine",
                "assumed_datacenter": {"alpha_s": DATACENTER.alpha, "beta": DATACENTER.beta},
                "assumed_wan": {"alpha_s": WAN.alpha, "beta": WAN.beta},
            },
            "assumptions": (
                "ring collectives, no overlap of communication with compute (the "
                "efficiency_full_overlap bound assumes perfect overlap); weak scaling (16 "
                "sequences per rank); DiLoCo: synchronous rounds every inner_steps, master "
                "downloads W-1 deltas on one link, convergence per token not modelled; a row's "
                "counts note says where it borrows the counts of another world size"
            ),
            "rows": rows,
        },
    }
    result["seconds"] = time.perf_counter() - began
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print_tables(result)
    print(f"\n{result['seconds']:.0f} s; wrote {output}")


if __name__ == "__main__":
    main()
