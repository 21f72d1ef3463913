"""Muon benchmark: speedtronic_optim.Muon against torch.optim.Muon, and newton_schulz against SVD.

Case 1 steps every hidden matrix of a GPT-style transformer at d_model 768 (per layer: four
768x768, two 2048x768, one 768x2048, as in a GPT-2-small block) with
torch.optim.Muon, with our Muon on the standard iteration (same algorithm: measures overhead), and
with our Muon on its default `auto` method (Gram Newton-Schulz for matrices with aspect >= 1.5);
ours orthogonalizes same-shaped matrices together in one batched Newton-Schulz.
Case 2 times `newton_schulz` against the exact polar factor by SVD (U @ Vh, float32).
Variants run interleaved in one process and the ratio of medians is reported (machines are noisy).

Usage: python tools/bench/bench_optim.py [--full] [--layers N] [--d-model D] [--repeats N]
                                         [--bf16-layers N] [--device cpu|cuda]
Default: d_model 128, 2 layers, 3 repeats, polar at 256/512 (minutes even where bf16 is emulated);
--full: d_model 768, 12 layers, 5 repeats, polar at 1024/2048 (the issue's sizes). Where bf16 is
emulated, `--full --repeats 1 --bf16-layers 1` finishes in about 20 minutes.
"ours default" is Muon's shipped settings: Gram for aspect >= 1.5 and the work dtype of
fast_work_dtype (float32 on CPUs without BF16 instructions, where torch's bf16 is emulated).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from speedtronic_optim import Muon, newton_schulz
from speedtronic_optim.newton_schulz import fast_work_dtype

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "optim.json"


def layer_shapes(d_model: int) -> list[tuple[int, int]]:
    """Hidden matrices of one layer: four d x d, two (8d/3) x d, one d x (8d/3) (2048 at d 768)."""
    hidden = round(8 * d_model / 3)
    return [(d_model, d_model)] * 4 + [(hidden, d_model)] * 2 + [(d_model, hidden)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _interleaved(
    variants: dict[str, Callable[[], object]], repeats: int, device: torch.device
) -> dict[str, float]:
    """Median seconds per variant, running the variants round-robin after one warm-up call each."""
    for fn in variants.values():
        fn()
    _sync(device)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            _sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def _muon_step(
    factory: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
    grads: list[torch.Tensor],
    device: torch.device,
) -> Callable[[], None]:
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for param, grad in zip(params, grads, strict=True):
        param.grad = grad
    optimizer = factory(params)
    return optimizer.step


def muon_case(
    layers: int, d_model: int, repeats: int, device: torch.device, bf16_layers: int | None = None
) -> dict[str, object]:
    """Time one Muon step over every hidden matrix of a `layers`-layer model.

    Every variant but "ours default" (torch.optim.Muon always works in bf16) steps only the first
    `bf16_layers` layers when asked and is scaled by layers / bf16_layers: each steps matrices
    independently per shape, so its time is additive over layers, and emulated bf16 on CPUs
    without BF16 instructions takes minutes per layer at d_model 768.
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
        "ours bf16 standard": _muon_step(
            lambda p: Muon(p, ns_method="standard", ns_dtype=torch.bfloat16, **settings),
            bf16_grads,
            device,
        ),
        # Gram runs in float32 only: in bf16 it amplifies rounding (newton_schulz.GRAM_DTYPES).
        "ours fp32 gram": _muon_step(
            lambda p: Muon(p, ns_dtype=torch.float32, **settings), bf16_grads, device
        ),
        "ours default": _muon_step(lambda p: Muon(p, **settings), grads, device),
    }
    seconds = _interleaved(variants, repeats, device)
    scale = layers / bf16_layers
    seconds = {
        name: value * (1.0 if name == "ours default" else scale) for name, value in seconds.items()
    }
    base = seconds["torch.optim.Muon"]
    return {
        "case": f"Muon step, {layers} layers x {len(shapes)} matrices (d_model {d_model})",
        "matrices": len(grads),
        "bf16_layers_timed": bf16_layers,
        "default_work_dtype": str(fast_work_dtype(device)),
        "seconds": seconds,
        "speedup_vs_torch": {name: base / value for name, value in seconds.items()},
    }


def svd_case(size: int, repeats: int, device: torch.device) -> dict[str, object]:
    """Time newton_schulz (5 steps, default work dtype) against the SVD polar factor at size x
    size.
    """
    torch.manual_seed(1)
    g = torch.randn(size, size, device=device)

    def polar() -> torch.Tensor:
        u, _, vh = torch.linalg.svd(g, full_matrices=False)
        return u @ vh

    seconds = _interleaved(
        {"newton_schulz": lambda: newton_schulz(g), "svd polar": polar}, repeats, device
    )
    return {
        "case": f"polar factor {size}x{size}",
        "seconds": seconds,
        "ns_over_svd": seconds["newton_schulz"] / seconds["svd polar"],
    }


def _write_json(path: Path, payload: dict[str, object]) -> None:
    # Atomic: a reader never sees half a file.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as handle:
        json.dump(payload, handle, indent=2)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


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
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    layers = args.layers or (12 if args.full else 2)
    d_model = args.d_model or (768 if args.full else 128)
    repeats = args.repeats or (5 if args.full else 3)
    device = torch.device(args.device)
    muon = muon_case(layers, d_model, repeats, device, args.bf16_layers)
    print(
        f"{muon['case']}, {repeats} repeats, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    if muon["bf16_layers_timed"] < layers:
        print(f"(bf16 variants timed on {muon['bf16_layers_timed']} of {layers} layers, scaled)")
    print(f"{'variant':<20}{'median s':>10}{'speedup vs torch':>18}")
    for name, value in muon["seconds"].items():
        print(f"{name:<20}{value:>10.3f}{muon['speedup_vs_torch'][name]:>17.2f}x")
    sizes = (1024, 2048) if args.full else (256, 512)
    polar = [svd_case(size, repeats, device) for size in sizes]
    print(f"\n{'polar factor':<16}{'newton_schulz s':>16}{'svd s':>10}{'ns/svd':>8}")
    for case in polar:
        s = case["seconds"]
        print(
            f"{case['case'][13:]:<16}{s['newton_schulz']:>16.3f}{s['svd polar']:>10.3f}"
            f"{case['ns_over_svd']:>8.2f}"
        )
    _write_json(
        args.out,
        {
            "benchmark": "optim",
            "device": str(device),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "machine": platform.processor() or platform.machine(),
            "repeats": repeats,
            "muon": muon,
            "polar": polar,
        },
    )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
