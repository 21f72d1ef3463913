"""CPU precision benchmark: BF16 autocast against FP32 for a matmul and an MLP forward+backward.

Each case runs its FP32 and BF16 variants alternately in one process, the first of each pair
alternating (machines are noisy, so the ratio of interleaved medians is the number to trust), and
reports the FP32/BF16 time ratio: above 1.0 means BF16 autocast is faster on this CPU.

Usage: python tools/bench/bench_precision.py [--quick] [--threads N] [--out PATH]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from speedtronic_config.atomic import atomic_json_dump
from speedtronic_systems.precision import cpu_bf16_supported

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "precision.json"


@dataclass
class Result:
    case: str
    fp32_ms: float
    bf16_ms: float
    ratio: float  # fp32_ms / bf16_ms: > 1 means BF16 autocast is faster
    max_rel_error: float  # of the BF16 output against FP32: what the speed costs in accuracy


def matmul_case(size: int) -> tuple[str, Callable[[], torch.Tensor]]:
    a, b = torch.randn(size, size), torch.randn(size, size)
    return f"matmul {size}x{size}x{size}", lambda: a @ b


def mlp_case(tokens: int, width: int) -> tuple[str, Callable[[], torch.Tensor]]:
    mlp = torch.nn.Sequential(
        torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
    )
    x = torch.randn(tokens, width)

    def step() -> torch.Tensor:
        mlp.zero_grad(set_to_none=True)
        out = mlp(x)
        out.float().square().mean().backward()
        return out

    return f"mlp fwd+bwd {tokens}x{width}->{4 * width}", step


def run(fn: Callable[[], torch.Tensor], bf16: bool) -> tuple[float, torch.Tensor]:
    context = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()
    start = time.perf_counter()
    with context:
        out = fn()
    return time.perf_counter() - start, out.detach().float()


def measure(name: str, fn: Callable[[], torch.Tensor], repeats: int) -> Result:
    run(fn, False), run(fn, True)  # warm-up: oneDNN picks and caches kernels on first use
    times: dict[bool, list[float]] = {False: [], True: []}
    outputs: dict[bool, torch.Tensor] = {}
    for index in range(repeats):
        # Interleaved, so drift in clock speed hits both sides alike; the first side alternates,
        # so what one call leaves in the caches does not always help the same side.
        for bf16 in (False, True) if index % 2 == 0 else (True, False):
            seconds, outputs[bf16] = run(fn, bf16)
            times[bf16].append(seconds)
    fp32, bf16 = statistics.median(times[False]) * 1e3, statistics.median(times[True]) * 1e3
    error = (
        (outputs[True] - outputs[False]).abs().max() / outputs[False].abs().max().clamp_min(1e-12)
    ).item()
    return Result(
        name, round(fp32, 3), round(bf16, 3), round(fp32 / bf16, 3), float(f"{error:.3g}")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller shapes and fewer repeats")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    # Emulated BF16 is ~50x slower than FP32 on CPUs without native support: keep the shapes modest.
    repeats = 5 if args.quick else 9
    cases = (
        [matmul_case(512), mlp_case(512, 256)]
        if args.quick
        else [matmul_case(512), matmul_case(1024), mlp_case(512, 256), mlp_case(1024, 512)]
    )
    results = [measure(name, fn, repeats) for name, fn in cases]
    machine = {
        "torch": torch.__version__,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn_bf16_supported": cpu_bf16_supported(),
    }
    print(
        f"CPU BF16 autocast vs FP32  (torch {machine['torch']}, {machine['threads']} threads, "
        f"capability {machine['cpu_capability']}, native BF16 reported: "
        f"{machine['mkldnn_bf16_supported']})"
    )
    print(f"{'case':<34}{'fp32 ms':>10}{'bf16 ms':>10}{'fp32/bf16':>11}{'max rel err':>13}")
    for r in results:
        print(
            f"{r.case:<34}{r.fp32_ms:>10.2f}{r.bf16_ms:>10.2f}{r.ratio:>11.2f}{r.max_rel_error:>13.2g}"
        )
    atomic_json_dump(
        {
            "benchmark": "precision",
            "machine": machine,
            "repeats": repeats,
            "results": [asdict(r) for r in results],
        },
        args.out,
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
