"""The settings `auto` should pick on CPU, measured: the allocator, torch.compile, bf16 autocast,
thread count.

Every variant is the main job (configs/quickstart.yaml, shuffled) or a larger model built through
speedtronic.runtime.build_runtime, as a user's config would build it; variants of one question
run interleaved, a fresh runtime each round, and the paired per-round ratio's median is reported.

- allocator: `run.cpu_allocator: caching` (what `auto` picks on CPU) against `default` (glibc's
  malloc as 2.0 left it) for the eager main job, each in a fresh process since the setting is
  process-wide; tokens/s, page faults per step and peak RSS;
- compile: `compile: true` against eager for the main job, each in a fresh process: compiled
  with an empty inductor cache (a first run) and again with the cache it left (a rerun);
  steady-state tokens/s after the warm-up, the one-off setup time, the end-to-end time of the
  whole 400-step job, and the steps after which compiling pays (`compile: auto` uses the cold one);
- bf16: `precision.mode: bf16` against fp32 at growing d_model, so `auto` can switch where bf16
  starts to pay (on CPUs with native BF16 only: elsewhere it is emulated and skipped);
- threads: torch intra-op threads 1 against all cores for the main job.
The loss after the timed steps is recorded for every variant: a faster setting must not train
worse.

Usage: python tools/bench/bench_cpu_settings.py [--quick] [--rounds N] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchlib import RESULTS, ensure_corpus, machine_info, quickstart_values, write_json
from speedtronic.runtime import build_runtime
from speedtronic_systems.precision import cpu_bf16_supported

WARMUP = 5
MAIN_JOB_STEPS = 400


def job(**sections: Any) -> dict[str, Any]:
    """Return the main job's config (shuffled, eager unless told, no checkpoints or evaluation)
    with overrides.
    """
    extra = {"compile": False}  # never the main job's `auto`: each question sets what it compares
    extra.update((key, value) for key, value in sections.items() if not isinstance(value, dict))
    nested = {key: value for key, value in sections.items() if isinstance(value, dict)}
    data = {"shuffle": True, "eval_every": None, **nested.pop("data", {})}
    values = quickstart_values(
        data=data,
        checkpoint={"enabled": False},
        logging={"level": "ERROR", "json_file": None, "progress": False},
        **nested,
    )
    values.update(extra)
    return values


def timed_run(values: dict[str, Any], steps: int, threads: int | None = None) -> dict[str, float]:
    """Build the runtime, fit WARMUP steps (compile happens here), then time `steps` more."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        started = time.perf_counter()
        trainer, _ = build_runtime(values)
        warm = trainer.fit(WARMUP)
        setup_s = time.perf_counter() - started
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        result = trainer.fit(WARMUP + steps)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        trainer.close()
    finally:
        torch.set_num_threads(previous)
    tokens = result.tokens - warm.tokens
    return {
        "tokens_per_s": tokens / result.elapsed_s,
        "step_s": result.elapsed_s / steps,
        "setup_s": setup_s,
        "loss": float(result.final_loss),
        "page_faults_per_step": faults / steps,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # Linux: KiB
    }


def compare(
    variants: dict[str, Callable[[], dict[str, float]]], rounds: int
) -> dict[str, list[dict[str, float]]]:
    """Run every variant once per round in a rotating order; return the measurements per name."""
    names = list(variants)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            runs[name].append(variants[name]())
    return runs


def summarize(runs: dict[str, list[dict[str, float]]], baseline: str) -> dict[str, Any]:
    """Return medians per variant and each variant's paired speedup over the baseline."""
    out: dict[str, Any] = {}
    for name, values in runs.items():
        speedups = [
            v["tokens_per_s"] / b["tokens_per_s"]
            for v, b in zip(values, runs[baseline], strict=True)
        ]
        fastest = max(v["tokens_per_s"] for v in values)
        out[name] = {
            "tokens_per_s": statistics.median(v["tokens_per_s"] for v in values),
            "tokens_per_s_per_round": [v["tokens_per_s"] for v in values],
            "setup_s": statistics.median(v["setup_s"] for v in values),
            "loss": values[-1]["loss"],
            "speedup_vs_" + baseline: statistics.median(speedups),
            "speedup_per_round": speedups,
            # Other sessions' bursts make rounds bimodal: the fastest round is the undisturbed one.
            "fastest_speedup": fastest / max(b["tokens_per_s"] for b in runs[baseline]),
        }
    return out


def child_run(
    kind: str, steps: int, cache_dir: str | None = None, allocator: str = "auto"
) -> dict[str, float]:
    """Time the main job in a fresh process (eager, or compiled with this inductor cache folder;
    with this `run.cpu_allocator`): only a new process sees a cold compile, as a user's first run
    does, and glibc's malloc as it starts.
    """
    command = [sys.executable, __file__, "--child", kind, "--steps", str(steps)]
    command += ["--allocator", allocator]
    env = dict(os.environ)
    if cache_dir is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def allocator_case(steps: int, rounds: int) -> dict[str, Any]:
    """glibc's default malloc against the caching one for the eager main job, fresh processes."""
    runs: dict[str, list[dict[str, float]]] = {"default": [], "caching": []}
    for index in range(rounds):
        order = ["default", "caching"] if index % 2 == 0 else ["caching", "default"]
        for allocator in order:
            runs[allocator].append(child_run("eager", steps, allocator=allocator))
    result = summarize(runs, "default")
    for name, values in runs.items():
        for key in ("page_faults_per_step", "peak_rss_mib"):
            result[name][key] = statistics.median(v[key] for v in values)
    return result


def compile_case(steps: int, rounds: int) -> dict[str, Any]:
    """Eager against torch.compile for the main job, each in its own process: compiled with an
    empty inductor cache (a first run on this machine) and again with the cache it left (a rerun).
    """
    runs: dict[str, list[dict[str, float]]] = {"eager": [], "compile": [], "compile_warm": []}
    for index in range(rounds):
        with tempfile.TemporaryDirectory() as cache:
            order = ["eager", "compile"] if index % 2 == 0 else ["compile", "eager"]
            for kind in order:
                runs[kind].append(child_run(kind, steps, cache))
                if kind == "compile":
                    runs["compile_warm"].append(child_run("compile", steps, cache))
    result = summarize(runs, "eager")
    eager = result["eager"]
    tokens_per_step = 16 * 128
    # What a user waits for: setup + WARMUP steps, then the rest of the 400 steps at steady state.
    rest = (MAIN_JOB_STEPS - WARMUP) * tokens_per_step
    for row in result.values():
        row["main_job_estimate_s"] = row["setup_s"] + rest / row["tokens_per_s"]
    for name in ("compile", "compile_warm"):
        compiled = result[name]
        suffix = name.removeprefix("compile")
        result["main_job_speedup_end_to_end" + suffix] = (
            eager["main_job_estimate_s"] / compiled["main_job_estimate_s"]
        )
        # `compile: auto` compiles a CPU run at least this long (cold: the conservative one;
        # speedtronic_systems.compile_choice).
        saved = tokens_per_step * (1 / eager["tokens_per_s"] - 1 / compiled["tokens_per_s"])
        extra = compiled["setup_s"] - eager["setup_s"]
        result["break_even_steps" + suffix] = (
            max(0, math.ceil(extra / saved)) if saved > 0 else None
        )
    return result


def bf16_case(widths: tuple[int, ...], steps: int, rounds: int) -> dict[str, Any]:
    """fp32 against bf16 autocast at each d_model (4 layers, context 256, 8 x 256 tokens)."""
    result: dict[str, Any] = {}
    for width in widths:
        shape = {
            "model": {"d_model": width, "n_head": max(4, width // 64), "max_seq_len": 256},
            "data": {"micro_batch_size": 8, "target_batch_size": 8},
        }
        runs = compare(
            {
                mode: lambda mode=mode, shape=shape: timed_run(
                    job(precision={"mode": mode}, **shape), steps
                )
                for mode in ("fp32", "bf16")
            },
            rounds,
        )
        result[f"d_model {width}"] = summarize(runs, "fp32")
    return result


def threads_case(steps: int, rounds: int) -> dict[str, Any]:
    """One torch thread against all of them for the main job."""
    cores = os.cpu_count() or 1
    runs = compare(
        {
            f"{cores} threads": lambda: timed_run(job(), steps, threads=cores),
            "1 thread": lambda: timed_run(job(), steps, threads=1),
        },
        rounds,
    )
    return summarize(runs, f"{cores} threads")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps, rounds and widths")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / "cpu_settings.json")
    parser.add_argument("--child", choices=("eager", "compile"), help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--allocator", default="auto", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        values = job(compile=args.child == "compile", run={"cpu_allocator": args.allocator})
        print(json.dumps(timed_run(values, args.steps)))
        return 0
    ensure_corpus()
    rounds = args.rounds or (2 if args.quick else 4)
    steps = 20 if args.quick else 30
    payload: dict[str, Any] = {
        "benchmark": "cpu_settings",
        "machine": machine_info(),
        "native_bf16": cpu_bf16_supported(),
        "rounds": rounds,
        "steps_timed": steps,
        "warmup_steps": WARMUP,
    }
    payload["allocator"] = allocator_case(steps, rounds)
    print("allocator (main job, eager):")
    for name, row in payload["allocator"].items():
        print(
            f"  {name:<8}{row['tokens_per_s']:>10,.0f} tokens/s  "
            f"x{row['speedup_vs_default']:.3f} (fastest x{row['fastest_speedup']:.3f})  "
            f"{row['page_faults_per_step']:,.0f} page faults/step  peak RSS "
            f"{row['peak_rss_mib']:,.0f} MiB"
        )
    # One compile takes tens of seconds on 2 cores: the quick (CI) run leaves it out.
    payload["compile"] = None if args.quick else compile_case(steps, rounds)
    print("compile (main job):" if payload["compile"] else "compile: skipped in --quick")
    for name in ("eager", "compile", "compile_warm") if payload["compile"] else ():
        row = payload["compile"][name]
        print(
            f"  {name:<8}{row['tokens_per_s']:>10,.0f} tokens/s  setup {row['setup_s']:6.1f} s  "
            f"x{row['speedup_vs_eager']:.3f} (fastest x{row['fastest_speedup']:.3f})  "
            f"400-step job ~{row['main_job_estimate_s']:.0f} s"
        )
    if payload["compile"]:
        comp = payload["compile"]
        print(
            f"  compiling pays for itself after {comp['break_even_steps']} steps "
            f"({comp['break_even_steps_warm']} with a warm cache)"
        )
    payload["threads"] = threads_case(steps, rounds)
    print("threads (main job):")
    for name, row in payload["threads"].items():
        ratio = next(value for key, value in row.items() if key.startswith("speedup_vs_"))
        print(
            f"  {name:<10}{row['tokens_per_s']:>10,.0f} tokens/s  x{ratio:.3f} "
            f"(fastest x{row['fastest_speedup']:.3f})"
        )
    if payload["native_bf16"]:
        widths = (128, 512) if args.quick else (128, 256, 512)
        payload["bf16"] = bf16_case(widths, 4 if args.quick else 8, rounds)
        print("bf16 autocast vs fp32 (4 layers, context 256, batch 8):")
        for width, rows in payload["bf16"].items():
            fp32, bf16 = rows["fp32"], rows["bf16"]
            print(
                f"  {width:<12} fp32 {fp32['tokens_per_s']:>8,.0f}  bf16 "
                f"{bf16['tokens_per_s']:>8,.0f} tokens/s  x{bf16['speedup_vs_fp32']:.3f} "
                f"(fastest x{bf16['fastest_speedup']:.3f})"
            )
    else:
        payload["bf16"] = None
        print("bf16: skipped, this CPU has no native BF16 (torch would emulate it)")
    write_json(args.out, payload)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
