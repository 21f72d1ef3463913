"""A 124M-parameter reference model on one GPU: tokens/s and MFU against the datasheet peak.

The reference transformer at GPT-2-small scale (12 layers, d_model 768, 12 heads, SwiGLU width
2048, vocabulary 50304, context 1024: 124M parameters with the tied head) trains for 50 steps
through speedtronic.runtime.build_runtime with bf16 autocast and torch.compile on random tokens
(throughput only). tokens/s and MFU are the trainer's own train_step metrics, median over the
steps after compilation; MFU divides the model's 6N + 12LHQT FLOPs per token by the datasheet
peak the trainer knows for the GPU (speedtronic_systems.precision.PEAK_FLOPS).

Usage: python tools/bench/bench_gpu.py [--steps 50] [--batch 16] [--device cuda]
       [--compile-mode reduce-overhead] (CUDA graphs through the trainer's compile_mode)
       [--tiny] (a 2-layer model for a CPU smoke run of this script) [--out PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchlib import RESULTS, machine_info, mfu_text, write_json
from speedtronic.runtime import build_runtime
from speedtronic_config.config import COMPILE_MODES
from speedtronic_systems.precision import device_peak_flops

MODEL_124M = {
    "name": "reference_transformer",
    "vocab_size": 50304,
    "max_seq_len": 1024,
    "n_layer": 12,
    "n_head": 12,
    "d_model": 768,
    "d_ff": 2048,
}
TINY = {
    **MODEL_124M,
    **{"vocab_size": 512, "max_seq_len": 64, "n_layer": 2, "d_model": 64, "n_head": 4, "d_ff": 128},
}
SKIP = 10  # compiled steps (and the recompile a first eval or shape change could trigger) left out


def config(model: dict[str, Any], steps: int, batch: int, device: str, compile_: bool) -> dict:
    """Return the benchmark's run: synthetic tokens, AdamW, bf16, compile, no checkpoints."""
    return {
        "run": {"name": "gpu-124m", "max_steps": steps, "device": device, "seed": 0},
        "model": model,
        "data": {
            "synthetic": True,
            "num_tokens": (steps + 2) * batch * (model["max_seq_len"] + 1),
            "micro_batch_size": batch,
            "target_batch_size": batch,
        },
        "optimizer": {"name": "adamw", "lr": 6e-4, "weight_decay": 0.1},
        "scheduler": {"name": "cosine", "warmup_steps": 5},
        "precision": {"mode": "bf16"},
        "checkpoint": {"enabled": False},
        "logging": {"every_steps": 1, "level": "WARNING", "progress": False},
        "compile": compile_,
    }


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the arguments this benchmark and profile_gpu.py share."""
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="2-layer model: a CPU smoke run")
    parser.add_argument("--no-compile", action="store_true")


def cuda_missing(device: str) -> bool:
    """Return True (and say so) when `device` is CUDA and this machine has none."""
    missing = device.startswith("cuda") and not torch.cuda.is_available()
    if missing:
        print("no CUDA GPU here: nothing measured")
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    add_run_arguments(parser)
    parser.add_argument("--compile-mode", choices=COMPILE_MODES, default="default")
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu.json")
    args = parser.parse_args(argv)
    if args.no_compile and args.compile_mode != "default":
        parser.error("--compile-mode needs the compiled model: drop --no-compile")
    if cuda_missing(args.device):
        return 2
    model = TINY if args.tiny else MODEL_124M
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        values = config(model, args.steps, args.batch, args.device, not args.no_compile)
        values["run"]["output_dir"] = tmp
        values["compile_mode"] = args.compile_mode
        trainer, _ = build_runtime(values)
        trainer.logger.hooks.append(
            lambda event, row: records.append(row) if event == "train_step" else None
        )
        parameters = trainer.model.num_parameters()
        result = trainer.fit()
        trainer.close()
    steady = records[min(SKIP, len(records) - 1) :]
    tokens_per_s = statistics.median(r["tokens_per_s"] for r in steady)
    mfu = [r["mfu"] for r in steady if "mfu" in r]
    payload = {
        "benchmark": "gpu",
        "machine": machine_info(),
        "device": args.device,
        "parameters": parameters,
        "model": model,
        "batch": args.batch,
        "steps": args.steps,
        "compile": not args.no_compile,
        "compile_mode": args.compile_mode,
        "precision": trainer.precision.mode,
        "tokens_per_s": tokens_per_s,
        "mfu": statistics.median(mfu) if mfu else None,
        "peak_flops": device_peak_flops(trainer.device, trainer.precision.dtype),
        "flops_per_token": trainer.model.flops_per_token(),
        "final_loss": result.final_loss,
        "elapsed_s": result.elapsed_s,
        "goal_mfu": 0.5,
    }
    print(
        f"{parameters / 1e6:.1f}M parameters, batch {args.batch} x {model['max_seq_len']}, "
        f"{payload['precision']}, compile {payload['compile']}: {tokens_per_s:,.0f} tokens/s, "
        f"MFU {mfu_text(payload['mfu'])} of {payload['peak_flops'] or 0:.3g} FLOP/s "
        "(goal >= 50% on H100/H200)"
    )
    write_json(args.out, payload)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
