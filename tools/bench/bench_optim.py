"""Muon benchmark: speedtronic_optim.Muon against torch.optim.Muon, and newton_schulz against SVD.

Case 1 steps every hidden matrix of a GPT-style transformer at d_model 768 (per layer: four
768x768, two 2048x768, one 768x2048) with torch.optim.Muon, with our Muon as shipped ("ours
default": same-shaped matrices orthogonalized together in batched chunks of up to 2^22 elements
on CPU, on one thread only as many as its L2 cache holds; Gram Newton-Schulz where the work dtype
is float32 and the aspect >= 1.5), with CPU chunks capped by elements alone ("ours 2^22 batches",
shipped before the one-thread cache rule; "ours 2^26 batches", the accelerator's cap, the 0.85x
shipped before that), and with float32 Gram work ("ours fp32 gram").
Case 2 times `newton_schulz` against the exact polar factor by SVD (U @ Vh, float32).
Case 3 (CPU with native BF16 only) reruns case 1 at a small size in a child process that limits
torch and oneDNN to AVX2 (ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2), where bf16 matmuls
are emulated as on an AVX2-only CPU: ours on float32 (what it picks there) against torch's bf16.
Case 4 (`--world N`, default 2; 1 skips it) reruns a Muon step under torchrun with N CPU ranks
(gloo, cpus/N threads each): Newton-Schulz split over the ranks against every rank doing all the
work, on replicas (DDP) and on FSDP2-style Shard(0) DTensor parameters, where torch.optim.Muon
(implicit DTensor redistribution) runs on the same parameters; it counts one sharded step's
collectives. Every timed call starts on all ranks together; the slowest rank's median counts.
Variants run interleaved in one process and the ratio of medians is reported (machines are noisy).

Usage: python tools/bench/bench_optim.py [--full] [--layers N] [--d-model D] [--repeats N]
                                         [--bf16-layers N] [--device cpu|cuda] [--world N]
                                         [--threads N]
Default: d_model 128, 2 layers, 3 repeats, polar at 256/512 (minutes even where bf16 is emulated);
--full: d_model 768, 12 layers, 5 repeats, polar at 1024/2048 (the issue's sizes). Where bf16 is
emulated, `--full --repeats 1 --bf16-layers 1` finishes in about 20 minutes. Case 4 runs at
d_model 128 x 2 layers (--full: WORLD_FULL_SIZE) whatever --d-model says: at 1 thread per rank
the issue's sizes take minutes per step. --threads sets torch's threads for cases 1-3 (default:
torch's own; a torchrun CPU worker gets OMP_NUM_THREADS=1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

import speedtronic_optim.muon as muon_module
from benchlib import machine_info, write_json
from speedtronic_optim import Muon, newton_schulz
from speedtronic_optim.newton_schulz import fast_work_dtype

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "optim.json"
# Case 4's (layers, d_model) with --full; the default is (2, 128).
WORLD_FULL_SIZE = (4, 384)


def layer_shapes(d_model: int) -> list[tuple[int, int]]:
    """Hidden matrices of one layer: four d x d, two (8d/3) x d, one d x (8d/3) (2048 at d 768)."""
    hidden = round(8 * d_model / 3)
    return [(d_model, d_model)] * 4 + [(hidden, d_model)] * 2 + [(d_model, hidden)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _interleaved(
    variants: dict[str, Callable[[], object]], repeats: int, device: torch.device
) -> dict[str, list[float]]:
    """Seconds per call of each variant, round-robin in a rotating order after one warm-up each."""
    for fn in variants.values():
        fn()
    _sync(device)
    names = list(variants)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for index in range(repeats):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            variants[name]()
            _sync(device)
            times[name].append(time.perf_counter() - start)
    return times


def _element_batches(step: Callable[[], None], elements: int) -> Callable[[], None]:
    """Return `step` run with CPU batches capped by `elements` alone, without the cache rule."""

    def run() -> None:
        saved = muon_module.MAX_CPU_BATCH_ELEMENTS, muon_module._one_thread_batch
        muon_module.MAX_CPU_BATCH_ELEMENTS = elements
        muon_module._one_thread_batch = lambda shape, dtype: elements
        try:
            step()
        finally:
            muon_module.MAX_CPU_BATCH_ELEMENTS, muon_module._one_thread_batch = saved

    return run


def _muon_step(
    factory: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
    grads: list[torch.Tensor],
    device: torch.device,
    wrap: Callable[[torch.Tensor], torch.Tensor] = lambda tensor: tensor,
) -> Callable[[], None]:
    """Return one optimizer's step over matrices of the grads' shapes (`wrap`: e.g. shard them)."""
    params = [torch.nn.Parameter(wrap(torch.zeros_like(g))) for g in grads]
    for param, grad in zip(params, grads, strict=True):
        param.grad = wrap(grad)
    optimizer = factory(params)
    return optimizer.step


def muon_case(
    layers: int,
    d_model: int,
    repeats: int,
    device: torch.device,
    bf16_layers: int | None = None,
    ours_dtype: torch.dtype | None = None,
) -> dict[str, object]:
    """Time one Muon step over every hidden matrix of a `layers`-layer model.

    Every variant but "ours default" (torch.optim.Muon always works in bf16) steps only the first
    `bf16_layers` layers when asked and is scaled by layers / bf16_layers: each steps matrices
    independently per shape, so its time is additive over layers, and emulated bf16 on CPUs
    without BF16 instructions takes minutes per layer at d_model 768. `ours_dtype` overrides the
    default work dtype (the AVX2 emulation, where the BF16 probe still sees the real CPU).
    """
    torch.manual_seed(0)
    shapes = layer_shapes(d_model)
    bf16_layers = min(bf16_layers or layers, layers)
    grads = [torch.randn(*shape, device=device) for _ in range(layers) for shape in shapes]
    bf16_grads = grads[: bf16_layers * len(shapes)]
    settings = dict(lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.1, ns_steps=5)
    variants = {
        "torch.optim.Muon": _muon_step(
            lambda p: torch.optim.Muon(p, **settings), bf16_grads, device
        ),
        "ours default": _muon_step(
            lambda p: Muon(p, ns_dtype=ours_dtype, **settings), grads, device
        ),
    }
    if ours_dtype is None:
        for power in (22, 26):
            variants[f"ours 2^{power} batches"] = _element_batches(
                _muon_step(lambda p: Muon(p, **settings), bf16_grads, device), 1 << power
            )
        # Gram runs in float32 only: in bf16 it amplifies rounding (newton_schulz.GRAM_DTYPES).
        variants["ours fp32 gram"] = _muon_step(
            lambda p: Muon(p, ns_dtype=torch.float32, **settings), bf16_grads, device
        )
    times = _interleaved(variants, repeats, device)
    scale = layers / bf16_layers
    times = {
        name: [t * (1.0 if name == "ours default" else scale) for t in values]
        for name, values in times.items()
    }
    seconds = {name: statistics.median(values) for name, values in times.items()}
    base = times["torch.optim.Muon"]
    return {
        "case": f"Muon step, {layers} layers x {len(shapes)} matrices (d_model {d_model})",
        "matrices": len(grads),
        "bf16_layers_timed": bf16_layers,
        "default_work_dtype": str(ours_dtype or fast_work_dtype(device)),
        "seconds": seconds,
        "seconds_per_round": times,
        # Paired: each round's ratio, then the median, so drift between rounds cancels.
        "speedup_vs_torch": {
            name: statistics.median(b / t for b, t in zip(base, values, strict=True))
            for name, values in times.items()
        },
    }


def avx2_case(repeats: int) -> dict[str, object] | None:
    """Return case 1 at d_model 256 measured in a child limited to AVX2, or None off BF16 CPUs."""
    if fast_work_dtype(torch.device("cpu")) != torch.bfloat16:
        return None  # already an AVX2-class CPU: case 1 itself is the AVX2 number
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    with tempfile.TemporaryDirectory(prefix="bench-avx2-") as tmp:
        out = Path(tmp) / "avx2.json"
        command = [sys.executable, __file__, "--avx2-child", "--repeats", str(repeats)]
        command += ["--threads", str(torch.get_num_threads())]
        subprocess.run([*command, "--out", str(out)], env=env, check=True)
        return json.loads(out.read_text())


def svd_case(size: int, repeats: int, device: torch.device) -> dict[str, object]:
    """Time newton_schulz (5 steps, default work dtype) against the SVD polar factor at size x
    size.
    """
    torch.manual_seed(1)
    g = torch.randn(size, size, device=device)

    def polar() -> torch.Tensor:
        u, _, vh = torch.linalg.svd(g, full_matrices=False)
        return u @ vh

    times = _interleaved(
        {"newton_schulz": lambda: newton_schulz(g), "svd polar": polar}, repeats, device
    )
    seconds = {name: statistics.median(values) for name, values in times.items()}
    return {
        "case": f"polar factor {size}x{size}",
        "seconds": seconds,
        "ns_over_svd": seconds["newton_schulz"] / seconds["svd polar"],
    }


def _ranks_interleaved(variants: dict[str, Callable[[], object]], repeats: int) -> dict:
    """Each rank's median seconds per variant (rotating order, as `_interleaved`); every timed
    call starts on all ranks together.
    """
    import torch.distributed as dist

    for fn in variants.values():
        fn()
    names = list(variants)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for index in range(repeats):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            dist.barrier()
            start = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in times.items()}
    per_rank: list[dict[str, float]] = [{}] * dist.get_world_size()
    dist.all_gather_object(per_rank, medians)
    slowest = {name: max(rank[name] for rank in per_rank) for name in variants}
    return {"seconds": slowest, "per_rank": per_rank}


def _collectives(step: Callable[[], object]) -> dict[str, int]:
    from torch.distributed.tensor.debug import CommDebugMode

    with CommDebugMode() as comms:
        step()
    return {str(op).removeprefix("c10d."): n for op, n in comms.get_comm_counts().items()}


def distributed_case(layers: int, d_model: int, repeats: int) -> dict[str, object]:
    """Per-rank Muon step times at this torchrun's world size (gloo, CPU), alike on every rank."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    world, cpu = dist.get_world_size(), torch.device("cpu")
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)  # every rank: the same matrices and gradients (replicas)
    grads = [torch.randn(*shape) for _ in range(layers) for shape in layer_shapes(d_model)]
    settings = dict(lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.1, ns_steps=5)

    def shard(tensor: torch.Tensor) -> torch.Tensor:
        return distribute_tensor(tensor, mesh, [Shard(0)])

    replicated = {
        "ours split": _muon_step(lambda p: Muon(p, distributed=True, **settings), grads, cpu),
        "ours every rank all": _muon_step(
            lambda p: Muon(p, distributed=False, **settings), grads, cpu
        ),
    }
    sharded = {
        "torch.optim.Muon": _muon_step(
            lambda p: torch.optim.Muon(p, **settings), grads, cpu, shard
        ),
        "ours bf16 standard split": _muon_step(
            lambda p: Muon(p, ns_method="standard", ns_dtype=torch.bfloat16, **settings),
            grads,
            cpu,
            shard,
        ),
        "ours default split": _muon_step(lambda p: Muon(p, **settings), grads, cpu, shard),
        "ours default every rank all": _muon_step(
            lambda p: Muon(p, distributed=False, **settings), grads, cpu, shard
        ),
    }
    shapes = f"{layers} layers x 7 matrices (d_model {d_model})"
    return {
        "case": f"Muon step at world size {world}, {shapes}",
        "world": world,
        "threads_per_rank": torch.get_num_threads(),
        "ddp": _ranks_interleaved(replicated, repeats),
        "fsdp": _ranks_interleaved(sharded, repeats),
        "fsdp_collectives_per_step": {name: _collectives(fn) for name, fn in sharded.items()},
    }


def world_case(world: int, layers: int, d_model: int, repeats: int) -> dict[str, object]:
    """Return case 4, run by `world` torchrun ranks of this script (cpus / world threads each)."""
    threads = str(max(1, (os.cpu_count() or 1) // world))
    with tempfile.TemporaryDirectory(prefix="bench-world-") as tmp:
        out = Path(tmp) / "world.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        command += [f"--nproc-per-node={world}", __file__, "--world-child"]
        command += ["--layers", str(layers), "--d-model", str(d_model), "--repeats", str(repeats)]
        env = {**os.environ, "OMP_NUM_THREADS": threads}
        subprocess.run([*command, "--out", str(out)], env=env, check=True)
        return json.loads(out.read_text())


def _print_distributed(case: dict[str, object]) -> None:
    print(f"{case['case']}, {case['threads_per_rank']} thread(s) per rank")
    for mode, base in (("ddp", "ours every rank all"), ("fsdp", "torch.optim.Muon")):
        seconds = case[mode]["seconds"]
        print(f"\n{mode:<28}{'slowest rank s':>15}{'speedup':>9}")
        for name, value in seconds.items():
            print(f"{name:<28}{value:>15.4f}{seconds[base] / value:>8.2f}x")
    print("\ncollectives of one FSDP step:")
    for name, counts in case["fsdp_collectives_per_step"].items():
        print(f"  {name:<28}{counts}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="d_model 768, 12 layers, 5 repeats")
    parser.add_argument("--d-model", type=int, default=None)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--bf16-layers",
        type=int,
        default=None,
        help="time the bf16 variants on this many layers and scale (emulated-bf16 CPUs)",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-avx2", action="store_true", help="skip the AVX2-emulation case")
    parser.add_argument("--avx2-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=2, help="ranks for case 4 (1: skip it)")
    parser.add_argument("--world-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=None, help="torch threads, cases 1-3")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    repeats = args.repeats or (5 if args.full else 3)
    if args.avx2_child:
        case = muon_case(1, 256, repeats, torch.device("cpu"), ours_dtype=torch.float32)
        write_json(args.out, {**case, "cpu_capability": torch.backends.cpu.get_cpu_capability()})
        return
    if args.world_child:
        _world_child(args.layers, args.d_model, repeats, args.out)
        return
    layers = args.layers or (12 if args.full else 2)
    d_model = args.d_model or (768 if args.full else 128)
    device = torch.device(args.device)
    muon = muon_case(layers, d_model, repeats, device, args.bf16_layers)
    print(
        f"{muon['case']}, {repeats} repeats, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    if muon["bf16_layers_timed"] < layers:
        print(f"(bf16 variants timed on {muon['bf16_layers_timed']} of {layers} layers, scaled)")
    _print_muon(muon)
    sizes = (1024, 2048) if args.full else (256, 512)
    polar = [svd_case(size, repeats, device) for size in sizes]
    print(f"\n{'polar factor':<16}{'newton_schulz s':>16}{'svd s':>10}{'ns/svd':>8}")
    for case in polar:
        s = case["seconds"]
        print(
            f"{case['case'][13:]:<16}{s['newton_schulz']:>16.3f}{s['svd polar']:>10.3f}"
            f"{case['ns_over_svd']:>8.2f}"
        )
    avx2 = None if args.no_avx2 or device.type != "cpu" else avx2_case(repeats)
    if avx2 is not None:
        print(f"\nAVX2 emulation (bf16 emulated as on AVX2-only CPUs): {avx2['case']}")
        _print_muon(avx2)
    world = None
    if args.world > 1:
        world = world_case(args.world, *(WORLD_FULL_SIZE if args.full else (2, 128)), repeats)
        print()
        _print_distributed(world)
    write_json(
        args.out,
        {
            "benchmark": "optim",
            "machine": machine_info(),
            "device": str(device),
            "full": args.full,
            "repeats": repeats,
            "muon": muon,
            "polar": polar,
            "avx2_emulation": avx2,
            "world": world,
            "goal_speedup": 1.0,
            "goal_ns_over_svd": 0.5,
        },
    )
    print(f"\nwrote {args.out}")


def _world_child(layers: int, d_model: int, repeats: int, out: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    case = distributed_case(layers, d_model, repeats)
    if dist.get_rank() == 0:
        write_json(out, case)
    # Both ranks done before either tears gloo down: a rank closing its pairs while the other
    # still used them aborted once in CI ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


def _print_muon(muon: dict[str, object]) -> None:
    print(f"{'variant':<20}{'median s':>10}{'speedup vs torch':>18}")
    for name, value in muon["seconds"].items():
        print(f"{name:<20}{value:>10.3f}{muon['speedup_vs_torch'][name]:>17.2f}x")


if __name__ == "__main__":
    main()
