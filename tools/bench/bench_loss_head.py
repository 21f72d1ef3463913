"""The loss head of the 124M model on CPU: plain logits + cross-entropy against the chunked one.

Forward and backward of the head and loss alone (hidden (N, d) -> logits (N, V) -> mean loss), as
ReferenceTransformer runs them with model.loss_chunk_size unset (plain) and set (chunked): time as
the ratio of interleaved paired rounds in one process, and peak memory as the resident-set high
water (Linux's VmHWM, reset before the step) each adds over its inputs, in a fresh process per side
(torch has no CPU allocator stats). Float32, then bf16 autocast.

Usage: python tools/bench/bench_loss_head.py [--rows 4096] [--chunks 1024 4096] [--vocab 50257]
       [--d-model 768] [--rounds 5] [--threads N] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchlib import RESULTS, interleaved, machine_info, median_ratio, seconds, write_json
from speedtronic_model.fused_loss import chunked_linear_cross_entropy
from speedtronic_systems.loss import causal_lm_loss

PRECISIONS = ("fp32", "bf16")


def inputs(rows: int, vocab: int, d_model: int) -> tuple[torch.Tensor, ...]:
    """Return (hidden, head weight, labels): a fixed draw, one label in eight ignored."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(rows, d_model, generator=generator).requires_grad_()
    weight = (torch.randn(vocab, d_model, generator=generator) * 0.02).requires_grad_()
    labels = torch.randint(0, vocab, (rows,), generator=generator)
    labels[::8] = -100
    return hidden, weight, labels


def step(side: str, precision: str, tensors: tuple[torch.Tensor, ...]) -> None:
    """One forward and backward of the head and loss; side is 'plain' or a chunk size."""
    hidden, weight, labels = tensors
    hidden.grad = weight.grad = None
    bf16 = precision == "bf16"
    with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext():
        if side == "plain":
            loss = causal_lm_loss(F.linear(hidden, weight), labels)
        else:
            loss = chunked_linear_cross_entropy(hidden, weight, labels, int(side))
    loss.backward()


def _timed(side: str, precision: str, tensors: tuple[torch.Tensor, ...]) -> Callable[[], float]:
    return lambda: seconds(lambda: step(side, precision, tensors))


def peak_mib(side: str, precision: str, args: argparse.Namespace) -> float:
    """Return the MiB one step adds to the resident-set high water, run in a fresh process."""
    code = (
        "import sys, json; sys.path[:0] = json.loads(sys.argv[1]); import bench_loss_head as b; "
        "print(b.child_peak(*sys.argv[2:]))"
    )
    shape = [str(v) for v in (args.rows, args.vocab, args.d_model, args.threads or 0)]
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(sys.path), side, precision, *shape],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(out.strip().splitlines()[-1])


def child_peak(side: str, precision: str, rows: str, vocab: str, d_model: str, threads: str) -> str:
    """In the fresh process: the high water one step reaches above the resident set before it."""
    if int(threads):
        torch.set_num_threads(int(threads))
    # A first step on a few rows pages in the kernels' code, which would count as the peak's.
    step(side, precision, inputs(8, int(vocab), int(d_model)))
    tensors = inputs(int(rows), int(vocab), int(d_model))
    # Linux resets the high water (VmHWM) to the resident set on this write: import's and the
    # inputs' transients stay out of the step's peak.
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kib("VmRSS")
    step(side, precision, tensors)
    return f"{(_status_kib('VmHWM') - before) / 1024:.1f}"


def _status_kib(key: str) -> int:
    """Return a /proc/self/status memory line (VmRSS, VmHWM) in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {key} line: peak memory needs Linux")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096, help="N = batch x sequence rows")
    parser.add_argument("--chunks", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, default=RESULTS / "loss_head.json")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    tensors = inputs(args.rows, args.vocab, args.d_model)
    sides = ["plain", *(str(chunk) for chunk in args.chunks)]
    payload: dict[str, Any] = {
        "benchmark": "loss_head",
        "machine": machine_info(),
        "rows": args.rows,
        "vocab": args.vocab,
        "d_model": args.d_model,
        "rounds": args.rounds,
        "results": {},
    }
    print(
        f"loss head fwd+bwd: {args.rows} rows x d_model {args.d_model} -> vocab {args.vocab}, "
        f"{args.rounds} interleaved rounds, {torch.get_num_threads()} threads"
    )
    for precision in args.precisions:
        for side in sides:
            step(side, precision, tensors)  # warm-up: oneDNN picks its kernels on first use
        times = interleaved({side: _timed(side, precision, tensors) for side in sides}, args.rounds)
        for side in sides:
            result = {
                "ms": round(statistics.median(times[side]) * 1e3, 1),
                "time_vs_plain": round(median_ratio(times[side], times["plain"]), 3),
                "peak_mib": peak_mib(side, precision, args),
            }
            payload["results"][f"{precision} {side}"] = result
            label = "plain" if side == "plain" else f"chunk {side}"
            print(
                f"  {precision} {label:<11} {result['ms']:8.1f} ms  x{result['time_vs_plain']:.3f}"
                f" of plain's time  peak +{result['peak_mib']:,.0f} MiB"
            )
        write_json(args.out, payload)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
