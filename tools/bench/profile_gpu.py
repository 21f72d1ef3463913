"""Where bench_gpu.py's 124M training step spends its GPU time, and what the trainer costs.

Builds the same run as bench_gpu.py (tools/bench/bench_gpu.py: model, fused AdamW, bf16, compile)
and steps it in a bare loop (forward, backward, clip, step) with no per-step host sync, so its
tokens/s set beside bench_gpu's trainer figure shows what the trainer's bookkeeping costs. Then it
profiles five bare steps and sums the GPU kernels' time by family (matrix products, attention,
Triton-fused elementwise/norm/loss kernels, optimizer, other), the question an MFU gap asks first.
With --variants it also times the bare loop under settings not yet tried on a GPU (twice the batch,
CUDA graphs, max-autotune, a bf16 residual stream, the chunked loss head of model.loss_chunk_size
at the batch and at twice it), each as a ratio to the plain compiled loop measured in the same run.

Usage: python tools/bench/profile_gpu.py [--batch 16] [--out PATH] [--variants NAME ...]
       [--tiny --device cpu --no-compile] (a CPU smoke run of this script; CPU time then)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch

from bench_gpu import MODEL_124M, TINY, add_run_arguments, config, cuda_missing
from benchlib import RESULTS, machine_info, mfu_text, write_json
from speedtronic.runtime import build_runtime
from speedtronic_systems.precision import datasheet_peak_flops

# First match wins: cuDNN's attention kernels carry "sm90" too, so attention is asked first.
FAMILIES = (
    ("attention", ("flash", "attention", "fmha", "sdpa")),
    ("matmul", ("gemm", "nvjet", "xmma", "cutlass", "sm90", "aten::mm", "matmul")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("triton (fused elementwise, norms, loss)", ("triton", "compiledfxgraph")),
)
PROFILED_STEPS = 5


class Variant(NamedTuple):
    """A candidate for the MFU gap, timed as a bare loop beside the plain one."""

    batch_factor: int = 1
    compile_options: dict[str, str] | None = None
    # Autocast keeps the residual stream (embedding output, every residual add, the norms'
    # inputs) in float32: a bf16 one halves the bytes the Triton elementwise/norm kernels move.
    bf16_residual: bool = False
    # model.loss_chunk_size: the head and loss in row chunks, never the whole (B*T, V) logits,
    # whose memory is what capped the batch.
    loss_chunk_size: int | None = None


# max-autotune benchmarks kernel choices while compiling: minutes on a GPU.
VARIANTS = {
    "batch_x2": Variant(batch_factor=2),
    "cuda_graphs": Variant(compile_options={"mode": "reduce-overhead"}),
    "max_autotune": Variant(compile_options={"mode": "max-autotune-no-cudagraphs"}),
    "bf16_residual": Variant(bf16_residual=True),
    "chunked_loss": Variant(loss_chunk_size=4096),
    "chunked_loss_batch_x2": Variant(batch_factor=2, loss_chunk_size=4096),
}


def family(kernel: str) -> str:
    """Return the family a kernel (or, on CPU, an operator) name belongs to."""
    low = kernel.lower()
    return next((name for name, keys in FAMILIES if any(k in low for k in keys)), "other")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(parser)
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu_profile.json")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=[])
    args = parser.parse_args(argv)
    compiling = [name for name in args.variants if VARIANTS[name].compile_options]
    if args.no_compile and compiling:
        parser.error(
            f"--variants {' '.join(compiling)} set torch.compile options; drop --no-compile"
        )
    if cuda_missing(args.device):
        return 2
    device = torch.device(args.device)
    model_config = TINY if args.tiny else MODEL_124M
    values = config(model_config, 50, args.batch, args.device, compile_=False)
    compile_ = not args.no_compile  # the bare loops' own torch.compile, not the trainer's
    with tempfile.TemporaryDirectory(prefix="profile-gpu-") as tmp:
        values["run"]["output_dir"] = tmp
        trainer, _ = build_runtime(values)
        payload = {
            "benchmark": "gpu_profile",
            "machine": machine_info(),
            **_measure(trainer, model_config, args.batch, device, compile_),
            "variants": {},
        }
        # Written after each part: a variant that outlasts gpu_check.sh's time limit (a compile,
        # a graph capture) is killed without a word, and what was measured before it stays.
        write_json(args.out, payload)
        plain = payload["tokens_per_s"]
        for name in args.variants:
            payload["variants"][name] = _variant(
                trainer, model_config, args.batch, name, compile_, plain
            )
            write_json(args.out, payload)
        trainer.close()
    print(
        f"bare loop, batch {args.batch}: {payload['tokens_per_s']:,.0f} tokens/s "
        f"(MFU {mfu_text(payload['mfu'])})"
    )
    print(f"{'device' if device.type == 'cuda' else 'CPU'} time per step by family:")
    for name, ms in payload["ms_per_step_by_family"].items():
        print(f"  {name:<42}{ms:8.2f} ms {ms / payload['profiled_ms_per_step']:7.1%}")
    print("top kernels:")
    for name, ms in payload["top_kernels_ms_per_step"].items():
        print(f"  {ms:8.2f} ms  {name[:100]}")
    for name, v in payload["variants"].items():
        print(
            f"variant {name}, batch {v['batch']}: failed ({v['error'][:200]})"
            if "error" in v
            else f"variant {name}, batch {v['batch']}: {v['tokens_per_s']:,.0f} tokens/s, "
            f"{v['ratio']:.3f}x the plain loop (MFU {mfu_text(v['mfu'])})"
        )
    print(f"wrote {args.out}")
    return 0


def _measure(
    trainer: Any, model_config: dict[str, Any], batch: int, device: torch.device, compile_: bool
) -> dict[str, Any]:
    """Time the bare loop, then profile it; return the numbers."""
    from torch.profiler import ProfilerActivity, profile

    model = trainer.model
    steps = _bare_loop(trainer, torch.compile(model) if compile_ else model, model_config, batch)
    rates = _rates(steps, batch * model_config["max_seq_len"])
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as profiler:
        steps(PROFILED_STEPS)
    per_kernel: dict[str, float] = defaultdict(float)
    for event in profiler.key_averages():
        if getattr(event, "is_user_annotation", False):
            continue  # a named range (Optimizer.step#AdamW.step) over kernels counted already
        on_device = event.device_type.name == "CUDA"
        us = event.self_device_time_total if device.type == "cuda" else event.self_cpu_time_total
        if us > 0 and (on_device or device.type != "cuda"):
            per_kernel[event.key] += us / 1e3 / PROFILED_STEPS
    families: dict[str, float] = defaultdict(float)
    for name, ms in per_kernel.items():
        families[family(name)] += ms
    tokens_per_s = statistics.median(rates)
    return {
        "device": str(device),
        "batch": batch,
        "compile": compile_,
        "model": model_config,
        "tokens_per_s": tokens_per_s,
        "rounds_tokens_per_s": rates,
        "mfu": _mfu(model, device, tokens_per_s),
        "profiled_ms_per_step": sum(families.values()),
        "ms_per_step_by_family": dict(sorted(families.items(), key=lambda kv: -kv[1])),
        "top_kernels_ms_per_step": dict(sorted(per_kernel.items(), key=lambda kv: -kv[1])[:12]),
    }


def _bare_loop(
    trainer: Any, compiled: Any, model_config: dict[str, Any], batch: int
) -> Callable[[int], None]:
    """Return steps(count): forward, backward, clip and step on random tokens, no host sync but a
    final one on CUDA.
    """
    model, optimizer, device = trainer.model, trainer.optimizer, trainer.device
    seq, vocab = model_config["max_seq_len"], model_config["vocab_size"]
    data = torch.randint(0, vocab, (8, batch, seq + 1), device=device)

    def steps(count: int) -> None:
        for index in range(count):
            tokens = data[index % len(data)]
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = compiled(tokens[:, :-1], tokens[:, 1:])["loss"]
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()

    return steps


def _rates(steps: Callable[[int], None], tokens_per_step: int) -> list[float]:
    """Return tokens/s of three 10-step rounds, after 8 steps that compile, autotune, allocate."""
    steps(8)
    rates = []
    for _ in range(3):
        started = time.perf_counter()
        steps(10)
        rates.append(10 * tokens_per_step / (time.perf_counter() - started))
    return rates


def _mfu(model: Any, device: torch.device, tokens_per_s: float) -> float | None:
    peak = datasheet_peak_flops(device, torch.bfloat16)  # MFU, as bench_gpu's: n/a elsewhere
    return model.flops_per_token() * tokens_per_s / peak if peak else None


def _variant(
    trainer: Any,
    model_config: dict[str, Any],
    batch: int,
    name: str,
    compile_: bool,
    plain_tokens_per_s: float,
) -> dict[str, Any]:
    """Time the bare loop under the named variant; return its tokens/s and ratio to the plain."""
    model, variant = trainer.model, VARIANTS[name]
    options, factor = variant.compile_options or {}, variant.batch_factor
    torch._dynamo.reset()  # compiled afresh with these options, not from the plain loop's
    compiled = torch.compile(model, **options) if compile_ else model
    steps = _bare_loop(trainer, compiled, model_config, batch * factor)
    # Cast where the stream starts; every later add and norm then stays bf16 under autocast.
    hook = (
        model.tok_emb.register_forward_hook(lambda _m, _i, out: out.to(torch.bfloat16))
        if variant.bf16_residual
        else None
    )
    # Forward reads it on every call; the plain loop's value comes back after.
    plain_chunk, model.config.loss_chunk_size = (
        model.config.loss_chunk_size,
        variant.loss_chunk_size,
    )
    try:
        rate = statistics.median(_rates(steps, batch * factor * model_config["max_seq_len"]))
    except Exception as error:  # an untried setting may fail (memory, graphs): keep the rest
        trainer.optimizer.zero_grad(set_to_none=True)  # no half step's gradients carry over
        return {"batch": batch * factor, "error": f"{type(error).__name__}: {error}"}
    finally:
        model.config.loss_chunk_size = plain_chunk
        if hook is not None:
            hook.remove()
    return {
        "batch": batch * factor,
        "compile_options": options,
        "bf16_residual": variant.bf16_residual,
        "loss_chunk_size": variant.loss_chunk_size,
        "tokens_per_s": rate,
        "ratio": rate / plain_tokens_per_s,
        "mfu": _mfu(model, trainer.device, rate),
    }


if __name__ == "__main__":
    sys.exit(main())
