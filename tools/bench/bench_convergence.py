"""Convergence on real text: Muon, Muon+, cautious Muon and AdamW, each at its own tuned lr.

Every run is the main job (configs/quickstart.yaml: the stdlib corpus, 4 layers, d_model 128,
16 x 128 tokens per step) built through speedtronic.runtime.build_runtime, with the same seed,
the same token budget and one fixed held-out set: windows spread evenly over the validation shard,
identical for every run, and the training windows shuffled. Each optimizer's lr comes from a small
sweep (all of it recorded); then, at that lr, a second sweep gives the parameters outside the
hidden matrices (embeddings, head, norms: Muon's AdamW branch, `optimizer.adamw_lr`) their own
rate, for AdamW too (built here: AdamW has no such setting). The best run per optimizer gives the
loss-vs-tokens curve. The full run also trains the best AdamW and Muon on the main job's
unshuffled data order, for comparison.
"Steps to AdamW's loss" is read two ways: off Muon's own curve (a lower bound on its speed: the
lr is still high mid-run), and by training Muon with shorter horizons (schedule decayed at the
end) and taking the shortest that reaches it.

Usage: python tools/bench/bench_convergence.py [--quick] [--steps N] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchlib import (
    RESULTS,
    best_run,
    ensure_corpus,
    machine_info,
    quickstart_values,
    rates_text,
    write_json,
)
from speedtronic.runtime import build_runtime
from speedtronic_data.shards import read_shard_tokens, resolve_shards
from speedtronic_optim import build_lr_scheduler, make_adamw, route_parameters

OPTIMIZERS: dict[str, dict[str, Any]] = {
    "adamw": {"name": "adamw"},
    "muon": {"name": "muon"},
    "muon_plus": {"name": "muon", "muon_plus": True},
    "cautious_muon": {"name": "muon", "cautious": True},
}
# Centred on each optimizer's best lr in earlier sweeps (AdamW 1e-3; Muon 4e-3-8e-3; AdamW at
# 8e-3 and Muon at 1e-3 were far worse), so the best of each grid is an interior point.
FULL_LRS = {
    "adamw": (5e-4, 1e-3, 2e-3, 4e-3),
    "muon": (2e-3, 4e-3, 8e-3),
    "muon_plus": (4e-3, 8e-3),
    "cautious_muon": (4e-3, 8e-3),
}
QUICK_LRS = {"adamw": (4e-3,), "muon": (4e-3,)}
# The second sweep: the rate of the parameters outside the hidden matrices, as multiples of the
# optimizer's best lr (Muon's best was 8x in earlier sweeps; AdamW's 1x, its uniform lr).
OTHER_LR_FACTORS = (4, 8, 16)
QUICK_OTHER_LR_FACTORS = (4,)
HORIZONS = (0.5, 0.55, 0.6, 0.75)
# Shorter runs want a higher lr: each horizon tries the 400-step best lr and these multiples of it.
HORIZON_OPTIMIZERS = ("muon", "muon_plus")
HORIZON_LR_FACTORS = (1, 2, 3)


def eval_batches(
    pattern: str, block_size: int, windows: int, batch: int
) -> list[dict[str, torch.Tensor]]:
    """Return `windows` causal windows spread evenly over the validation shards, in batches."""
    tokens = np.concatenate([read_shard_tokens(path) for path in resolve_shards(pattern)])
    starts = np.linspace(0, len(tokens) - block_size - 1, windows).astype(np.int64)
    rows = torch.from_numpy(
        np.stack([tokens[s : s + block_size + 1] for s in starts]).astype(np.int64)
    )
    return [
        {"input_ids": rows[i : i + batch, :-1], "labels": rows[i : i + batch, 1:]}
        for i in range(0, windows, batch)
    ]


@torch.no_grad()
def held_out_loss(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]]) -> float:
    """Return the mean next-token loss over every token of the fixed held-out batches."""
    was_training = model.training
    model.eval()
    total = count = 0.0
    for batch in batches:
        total += float(model(**batch)["loss"]) * batch["labels"].numel()
        count += batch["labels"].numel()
    model.train(was_training)
    return total / count


def split_adamw(trainer: Any, other_lr: float) -> None:
    """Give an AdamW trainer's non-matrix parameters (those Muon would leave to AdamW) their own
    rate: the AdamW counterpart of Muon's `optimizer.adamw_lr`, built here for the comparison.
    """
    routing = route_parameters(trainer.model)
    built = trainer.optimizer.defaults
    trainer.optimizer = make_adamw(
        [{"params": routing.muon}, {"params": routing.adamw, "lr": other_lr}],
        **{key: built[key] for key in ("lr", "betas", "eps", "weight_decay", "fused")},
    )
    trainer.scheduler = build_lr_scheduler(trainer.optimizer, trainer.config.scheduler)


def train_run(
    values: dict[str, Any],
    batches: list[dict[str, torch.Tensor]],
    eval_every: int,
    adamw_split_lr: float | None = None,
) -> dict[str, Any]:
    """Train one config to its step target, evaluating the held-out set every eval_every steps
    (an AdamW config with `adamw_split_lr` gets `split_adamw` first).
    """
    with tempfile.TemporaryDirectory(prefix="bench-conv-") as tmp:
        values = {
            **values,
            "run": {**values["run"], "output_dir": tmp},
            "checkpoint": {**values["checkpoint"], "enabled": False},
            "logging": {"every_steps": 1, "level": "WARNING", "progress": False},
            "data": {**values["data"], "eval_every": None},
        }
        trainer, _ = build_runtime(values)
        if adamw_split_lr is not None:
            split_adamw(trainer, adamw_split_lr)
        losses: list[float] = []
        trainer.logger.hooks.append(
            lambda event, record: losses.append(record["loss"]) if event == "train_step" else None
        )
        target = trainer.max_steps
        tokens_per_step = values["data"]["target_batch_size"] * values["model"]["max_seq_len"]
        curve = [(0, 0, held_out_loss(trainer.model, batches))]
        train_seconds = 0.0
        for step in range(eval_every, target + eval_every, eval_every):
            result = trainer.fit(min(step, target))
            train_seconds += result.elapsed_s
            loss = held_out_loss(trainer.model, batches)
            curve.append((trainer.step, trainer.step * tokens_per_step, loss))
            if not math.isfinite(curve[-1][2]):
                break
        trainer.close()
    return {
        "curve": curve,
        "train_loss": losses,
        "final_val_loss": curve[-1][2],
        "steps": trainer.step,
        "tokens": trainer.step * tokens_per_step,
        "train_seconds": train_seconds,
        "tokens_per_s": trainer.step * tokens_per_step / train_seconds,
    }


def run_config(
    optimizer: str, lr: float, steps: int, shuffle: bool = True, other_lr: float | None = None
) -> dict[str, Any]:
    """Return the quickstart config for one optimizer, lr, non-matrix lr and step budget."""
    section = {"muon_plus": False, "cautious": False, **OPTIMIZERS[optimizer], "lr": lr}
    section["adamw_lr"] = other_lr if section["name"] == "muon" else None
    return quickstart_values(run={"max_steps": steps}, optimizer=section, data={"shuffle": shuffle})


def train_point(
    name: str,
    lr: float,
    other_lr: float | None,
    steps: int,
    batches: list[dict[str, torch.Tensor]],
    eval_every: int,
    shuffle: bool = True,
) -> dict[str, Any]:
    """Train optimizer `name` at `lr`, its non-matrix parameters at `other_lr` (None: `lr`)."""
    values = run_config(name, lr, steps, shuffle, other_lr)
    split = other_lr if OPTIMIZERS[name]["name"] == "adamw" else None
    return {"lr": lr, "other_lr": other_lr} | train_run(values, batches, eval_every, split)


def steps_to_reach(curve: list[tuple[int, int, float]], target: float) -> float | None:
    """Return the (linearly interpolated) step where the curve first reaches target, or None."""
    for (s0, _, l0), (s1, _, l1) in zip(curve, curve[1:], strict=False):
        if l1 <= target:
            return s1 if l0 == l1 else s0 + (s1 - s0) * (l0 - target) / (l0 - l1)
    return None


def sweep(
    lrs: dict[str, tuple[float, ...]],
    other_factors: tuple[float, ...],
    steps: int,
    batches: list[dict[str, torch.Tensor]],
    eval_every: int,
) -> dict[str, list[dict[str, Any]]]:
    """Train every optimizer at every lr of its grid, then at its best lr with the non-matrix
    parameters at each factor of it; return the runs per optimizer.
    """
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in lrs}

    def point(name: str, lr: float, other_lr: float | None) -> None:
        started = time.perf_counter()
        run = train_point(name, lr, other_lr, steps, batches, eval_every)
        runs[name].append(run)
        print(
            f"  {name:<14} {rates_text(run):<32} held-out loss {run['final_val_loss']:.4f}  "
            f"({run['tokens_per_s']:,.0f} tokens/s, {time.perf_counter() - started:.0f} s)",
            flush=True,
        )

    for name, grid in lrs.items():
        for lr in grid:
            point(name, lr, None)
        best_lr = best_run(runs[name])["lr"]
        for factor in other_factors:
            point(name, best_lr, best_lr * factor)
    return runs


def shortest_horizon(
    name: str,
    lr: float,
    other_lr: float | None,
    fractions: list[float],
    steps: int,
    target: float,
    batches: list[dict[str, torch.Tensor]],
    record: list[dict[str, Any]],
) -> dict[str, Any] | None:
    """Train `name` with its whole schedule (decay included) over each fraction of `steps`,
    shortest first, at each multiple of lr (the non-matrix lr stays); return the first fraction
    whose best run reaches `target` (with its rates and loss), or None. Every run is appended to
    `record`.
    """
    for fraction in fractions:
        short = round(fraction * steps)
        runs = []
        for factor in HORIZON_LR_FACTORS:
            run = train_point(name, lr * factor, other_lr, short, batches, short)
            runs.append(run | {"optimizer": name, "fraction": fraction})
            print(f"  {name} {rates_text(run)} over {short} steps: {run['final_val_loss']:.4f}")
        record.extend(runs)
        reached = [run for run in runs if run["final_val_loss"] <= target]  # NaN never is
        if reached:
            best = best_run(reached)
            return {
                "fraction": fraction,
                "steps": short,
                "lr": best["lr"],
                "other_lr": best["other_lr"],
                "loss": best["final_val_loss"],
            }
    return None


def _horizon_text(by_horizon: dict[str, dict[str, Any] | None]) -> str:
    parts = []
    for name, found in by_horizon.items():
        what = (
            "no horizon tried"
            if found is None
            else f"{found['fraction']:.2f}x ({rates_text(found)})"
        )
        parts.append(f"{name} {what}")
    return ", ".join(parts) or "not run"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="60 steps, Muon and AdamW, one lr and non-matrix lr"
    )
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument(
        "--grid",
        nargs="+",
        default=None,
        metavar="NAME=LR[,LR]",
        help="the lrs to run per optimizer instead of the full grid (e.g. adamw=1e-3 muon=4e-3)",
    )
    parser.add_argument(
        "--other-lr-factors",
        type=float,
        nargs="*",
        default=None,
        help="non-matrix lrs to try, as multiples of each optimizer's best lr (none: skip)",
    )
    parser.add_argument(
        "--horizons", type=float, nargs="*", default=None, help="Muon horizon fractions"
    )
    parser.add_argument("--no-ablations", action="store_true", help="skip the unshuffled runs")
    parser.add_argument(
        "--earlier",
        type=Path,
        default=None,
        help="JSON of sweep runs measured earlier with this harness, recorded beside this run's",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "convergence.json")
    args = parser.parse_args(argv)
    ensure_corpus()
    steps = args.steps or (60 if args.quick else 400)
    eval_every = 20 if args.quick else 25
    windows = 64 if args.quick else 256
    base = quickstart_values()
    block = base["model"]["max_seq_len"]
    batches = eval_batches(base["data"]["val_shard_path"], block, windows, 32)
    print(
        f"{steps} steps of {base['data']['target_batch_size']} x {base['model']['max_seq_len']} "
        f"tokens; held-out set: {windows} windows spread over the validation shard"
    )
    grid = QUICK_LRS if args.quick else FULL_LRS
    if args.grid:
        grid = {
            name: tuple(float(lr) for lr in lrs.split(","))
            for name, lrs in (item.split("=") for item in args.grid)
        }
    factors = QUICK_OTHER_LR_FACTORS if args.quick else OTHER_LR_FACTORS
    if args.other_lr_factors is not None:
        factors = tuple(args.other_lr_factors)
    runs = sweep(grid, factors, steps, batches, eval_every)
    best = {name: best_run(grid) for name, grid in runs.items()}
    target = best["adamw"]["final_val_loss"]
    muon = best["muon"]
    reach = steps_to_reach(muon["curve"], target)
    horizons: list[dict[str, Any]] = []
    by_horizon: dict[str, dict[str, Any] | None] = {}
    if not args.quick:
        fractions = sorted(HORIZONS if args.horizons is None else args.horizons)
        for name in HORIZON_OPTIMIZERS:
            found = best[name]
            by_horizon[name] = shortest_horizon(
                name, found["lr"], found["other_lr"], fractions, steps, target, batches, horizons
            )
    ablations: list[dict[str, Any]] = []
    if not (args.quick or args.no_ablations):
        # The main job's own data order (configs/quickstart.yaml leaves data.shuffle false).
        for name in ("adamw", "muon"):
            found = best[name]
            run = train_point(name, found["lr"], found["other_lr"], steps, batches, steps, False)
            ablations.append({"optimizer": name, "shuffle": False, **run})
            print(f"  {name} without shuffling: held-out loss {run['final_val_loss']:.4f}")
    summary = {
        "adamw_final_val_loss": target,
        "muon_final_val_loss": muon["final_val_loss"],
        "muon_steps_to_adamw_loss_on_curve": reach,
        "muon_step_fraction_on_curve": None if reach is None else reach / steps,
        # Per optimizer: the shortest horizon (and its lr) whose decayed run reaches AdamW's loss.
        "shortest_horizon_reaching_adamw": by_horizon,
        "goal_step_fraction": 0.6,
        "best_lr": {name: run["lr"] for name, run in best.items()},
        # None: the non-matrix parameters did best at the optimizer's lr itself.
        "best_other_lr": {name: run["other_lr"] for name, run in best.items()},
        "best_final_val_loss": {name: run["final_val_loss"] for name, run in best.items()},
    }
    print(f"{'optimizer':<14}{'best rates':<34}{'held-out loss':>13}{'tokens/s':>10}")
    for name, run in best.items():
        print(
            f"{name:<14}{rates_text(run):<34}{run['final_val_loss']:>13.4f}"
            f"{run['tokens_per_s']:>10,.0f}"
        )
    fraction = summary["muon_step_fraction_on_curve"]
    print(
        f"Muon reaches AdamW's {target:.4f} at step {reach} on its own curve "
        f"({'never' if fraction is None else f'{fraction:.2f}x'} the steps); shortest horizon "
        f"reaching it: {_horizon_text(by_horizon)} (goal <= 0.6)"
    )
    write_json(
        args.out,
        {
            "benchmark": "convergence",
            "machine": machine_info(),
            "quick": args.quick,
            "steps": steps,
            "eval_every": eval_every,
            "held_out_windows": windows,
            "held_out_tokens": windows * base["model"]["max_seq_len"],
            "config": {"model": base["model"], "scheduler": base["scheduler"], "shuffle": True},
            "summary": summary,
            "runs": runs,
            "horizons": horizons,
            "ablations": ablations,
            "earlier_sweep": json.loads(args.earlier.read_text()) if args.earlier else None,
        },
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
