"""Speedtronic against what a user would install instead, on the main job's model and data.

Every framework trains the same ReferenceTransformer (configs/quickstart.yaml: 4 layers, d_model
128, context 128), from the same seeded initialization, with the same optimizer and schedule
(speedtronic_optim's hybrid Muon and WSD, built identically for each) on the same batches (the
first steps of the shuffled stdlib shard loader, in the same order):

- Speedtronic: speedtronic.runtime.build_runtime(config) and Trainer.fit, as a user would;
- a hand-written PyTorch loop (zero_grad, forward, backward, step, scheduler step, loss.item());
- PyTorch Lightning's Trainer with a LightningModule around the model;
- the Hugging Face Trainer with the optimizer and scheduler passed in.

The first, untimed Speedtronic run switches the process's malloc to caching (`run.cpu_allocator:
auto` on CPU, process-wide), so every timed round of every framework runs with that allocator: the
ratios compare the training loops, not malloc settings (bench_cpu_settings.py measures those).
Each round runs every framework once, from construction to its teardown, in a rotating order;
tokens/s is over the steps after the warm-up up to the end of the last step (steady state: each
framework's clock stops in its own last-step hook, so no one's teardown counts) and end to end
(construction and teardown included: Lightning's and the HF Trainer's end of fit, Speedtronic's
close()). The per-step losses must agree across frameworks (identical work, not just similar).
Lightning and transformers are benchmark-only dependencies (hatch env `bench`); without them those
rows are skipped and say so.

Usage: python tools/bench/bench_peers.py [--quick] [--steps N] [--rounds N] [--out PATH]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from benchlib import (
    RESULTS,
    ensure_corpus,
    machine_info,
    median_ratio,
    quickstart_values,
    write_json,
)
from speedtronic.runtime import build_runtime, seed_everything
from speedtronic_config import SpeedtronicConfig
from speedtronic_data import build_dataloader
from speedtronic_model import build_model
from speedtronic_optim import build_lr_scheduler, build_optimizer
from speedtronic_systems.cpu_allocator import caching_enabled

WARMUP = 10  # steps left out of the steady-state rate: first-call kernel selection, allocator


def bench_config(steps: int) -> dict[str, Any]:
    """Return the main job's config for `steps` steps without checkpoints or evaluation."""
    return quickstart_values(
        run={"max_steps": steps},
        data={"shuffle": True, "eval_every": None},
        checkpoint={"enabled": False},
        logging={"level": "WARNING", "json_file": None, "progress": False},
    )


class Batches(Dataset):
    """Precomputed batches, one per index: every framework sees the same tensors in order."""

    def __init__(self, batches: list[dict[str, torch.Tensor]]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.batches[index]


def first_batches(config: SpeedtronicConfig, steps: int) -> list[dict[str, torch.Tensor]]:
    """Return the first `steps` batches of the loader build_runtime builds for this config."""
    loader = build_dataloader(config.data)
    batches: list[dict[str, torch.Tensor]] = []
    while len(batches) < steps:
        batches.extend(batch for _, batch in zip(range(steps - len(batches)), loader, strict=False))
    return batches


def fresh_parts(
    config: SpeedtronicConfig,
) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    """Return the model, optimizer and schedule exactly as build_runtime makes them."""
    seed_everything(config.run.seed)
    model = build_model(config.model)
    optimizer = build_optimizer(model, config.optimizer)
    return model, optimizer, build_lr_scheduler(optimizer, config.scheduler)


class Clock:
    """Marks the wall time at construction, after the warm-up steps, after the last step and
    after teardown.
    """

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.warm = self.last = self.end = self.start
        self.losses: list[float] = []

    def result(self, steps: int, tokens_per_step: int) -> dict[str, Any]:
        return {
            "steady_tokens_per_s": (steps - WARMUP) * tokens_per_step / (self.last - self.warm),
            "end_to_end_tokens_per_s": steps * tokens_per_step / (self.end - self.start),
            "teardown_s": self.end - self.last,
        }


def run_speedtronic(config: dict[str, Any], batches: list, steps: int, record: bool) -> Clock:
    """Build the runtime from the config and fit, as `speedtronic train` does."""
    clock = Clock()
    trainer, _ = build_runtime(config)
    if record:  # every step's loss for the identity check; timed runs keep the config's cadence
        trainer.logger.every_steps = 1
        trainer.logger.hooks.append(
            lambda event, row: clock.losses.append(row["loss"]) if event == "train_step" else None
        )
    trainer.fit(WARMUP)
    clock.warm = time.perf_counter()
    trainer.fit(steps)
    clock.last = time.perf_counter()
    trainer.close()
    clock.end = time.perf_counter()
    return clock


def run_manual(config: SpeedtronicConfig, batches: list, steps: int, record: bool) -> Clock:
    """The loop anyone would write by hand, with the loss read back every step."""
    clock = Clock()
    model, optimizer, scheduler = fresh_parts(config)
    model.train()
    for step, batch in enumerate(batches[:steps], 1):
        optimizer.zero_grad(set_to_none=True)
        loss = model(**batch)["loss"]
        loss.backward()
        optimizer.step()
        scheduler.step()
        clock.losses.append(loss.item())
        if step == WARMUP:
            clock.warm = time.perf_counter()
    clock.last = clock.end = time.perf_counter()
    return clock


def run_lightning(config: SpeedtronicConfig, batches: list, steps: int, record: bool) -> Clock:
    """PyTorch Lightning's Trainer driving a LightningModule around the same model."""
    import lightning as L

    quiet_peers()  # after the import: Lightning sets its own loggers up when first imported
    clock = Clock()
    model, optimizer, scheduler = fresh_parts(config)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: dict[str, torch.Tensor], index: int) -> torch.Tensor:
            return self.model(**batch)["loss"]

        def on_train_batch_end(self, outputs: Any, batch: Any, index: int) -> None:
            if record:
                clock.losses.append(float(outputs["loss"]))
            if index + 1 == WARMUP:
                clock.warm = time.perf_counter()
            elif index + 1 == steps:
                clock.last = time.perf_counter()

        def configure_optimizers(self) -> Any:
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
            }

    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
    )
    loader = DataLoader(Batches(batches[:steps]), batch_size=None, shuffle=False)
    trainer.fit(Module(), train_dataloaders=loader)
    clock.end = time.perf_counter()
    return clock


def run_hf(config: SpeedtronicConfig, batches: list, steps: int, record: bool) -> Clock:
    """The Hugging Face Trainer with the same optimizer and schedule passed in."""
    import transformers

    clock = Clock()
    model, optimizer, scheduler = fresh_parts(config)

    class Steps(transformers.TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == WARMUP:
                clock.warm = time.perf_counter()
            elif state.global_step == steps:
                clock.last = time.perf_counter()

    class Trainer(transformers.Trainer):
        def get_train_dataloader(self) -> DataLoader:
            return DataLoader(Batches(batches[:steps]), batch_size=None, shuffle=False)

        def floating_point_ops(self, inputs: dict[str, Any]) -> int:
            # HF's own formula; it calls num_parameters(exclude_embeddings=True), a
            # PreTrainedModel keyword that ReferenceTransformer spells non_embedding.
            return 6 * inputs["input_ids"].numel() * model.num_parameters(non_embedding=True)

        def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            loss = super().compute_loss(model, inputs, *args, **kwargs)
            if record:
                clock.losses.append(float(loss[0] if isinstance(loss, tuple) else loss))
            return loss

    with tempfile.TemporaryDirectory(prefix="bench-hf-") as out:
        args = transformers.TrainingArguments(
            output_dir=out,
            max_steps=steps,
            per_device_train_batch_size=config.data.micro_batch_size,
            max_grad_norm=0.0,  # Speedtronic's quickstart does not clip either
            logging_strategy="no",
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            use_cpu=True,
            dataloader_pin_memory=False,
            seed=config.run.seed,
        )
        trainer = Trainer(
            model=model,
            args=args,
            optimizers=(optimizer, scheduler),
            callbacks=[Steps()],
        )
        trainer.remove_callback(transformers.PrinterCallback)  # its end-of-run metrics print
        trainer.train()
    clock.end = time.perf_counter()
    return clock


def available(module: str) -> bool:
    """Return whether a peer framework is importable here."""
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def quiet_peers() -> None:
    """Silence the peers' startup banners and tips, so the table stays readable."""
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for name in ("lightning", "lightning.pytorch", "pytorch_lightning", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)
        for child in list(logging.root.manager.loggerDict):
            if child.startswith(name + "."):
                logging.getLogger(child).setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30 steps x 2 rounds")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / "peers.json")
    args = parser.parse_args(argv)
    steps = args.steps or (30 if args.quick else 60)
    rounds = args.rounds or (2 if args.quick else 4)
    quiet_peers()
    ensure_corpus()
    values = bench_config(steps)
    config = SpeedtronicConfig.from_dict(values)
    batches = first_batches(config, steps)
    tokens_per_step = batches[0]["input_ids"].numel()
    runners: dict[str, Callable[[bool], Clock]] = {
        "speedtronic": lambda record: run_speedtronic(values, batches, steps, record),
        "hand-written loop": lambda record: run_manual(config, batches, steps, record),
    }
    missing = []
    for name, module, runner in (
        ("lightning", "lightning", run_lightning),
        ("hf trainer", "transformers", run_hf),
    ):
        if available(module):
            runners[name] = lambda record, runner=runner: runner(config, batches, steps, record)
        else:
            missing.append(name)
    # Untimed first runs: imports, oneDNN kernel selection, the FLOPs probe; and every step's loss.
    losses = {name: run(True).losses for name, run in runners.items()}
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in runners}
    names = list(runners)
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            results[name].append(runners[name](False).result(steps, tokens_per_step))
    rows = {}
    for name, runs in results.items():
        steady = [r["steady_tokens_per_s"] for r in runs]
        whole = [r["end_to_end_tokens_per_s"] for r in runs]
        ours_steady = [r["steady_tokens_per_s"] for r in results["speedtronic"]]
        ours_whole = [r["end_to_end_tokens_per_s"] for r in results["speedtronic"]]
        rows[name] = {
            "steady_tokens_per_s": statistics.median(steady),
            "end_to_end_tokens_per_s": statistics.median(whole),
            "speedtronic_over_this_steady": median_ratio(ours_steady, steady),
            "speedtronic_over_this_end_to_end": median_ratio(ours_whole, whole),
            "steady_per_round": steady,
            "end_to_end_per_round": whole,
            "teardown_s": statistics.median(r["teardown_s"] for r in runs),
            "max_loss_diff_vs_speedtronic": max(
                abs(a - b) for a, b in zip(losses[name], losses["speedtronic"], strict=True)
            ),
            "final_loss": losses[name][-1],
        }
    print(
        f"{steps} steps x {rounds} rounds, {tokens_per_step} tokens/step, "
        f"{torch.get_num_threads()} threads"
    )
    print(
        f"{'framework':<20}{'tok/s steady':>13}{'ST / this':>10}{'tok/s e2e':>11}"
        f"{'ST / this':>10}{'teardown s':>11}{'max |dloss|':>13}"
    )
    for name, row in rows.items():
        print(
            f"{name:<20}{row['steady_tokens_per_s']:>13,.0f}"
            f"{row['speedtronic_over_this_steady']:>10.3f}{row['end_to_end_tokens_per_s']:>11,.0f}"
            f"{row['speedtronic_over_this_end_to_end']:>10.3f}{row['teardown_s']:>11.3f}"
            f"{row['max_loss_diff_vs_speedtronic']:>13.2g}"
        )
    for name in missing:
        print(f"{name}: not installed here (run through `hatch run bench`, which installs it)")
    write_json(
        args.out,
        {
            "benchmark": "peers",
            "machine": machine_info(),
            "steps": steps,
            "warmup_steps": WARMUP,
            "rounds": rounds,
            "tokens_per_step": tokens_per_step,
            "cpu_allocator": "caching" if caching_enabled() else "default",
            "frameworks": rows,
            "missing": missing,
            "goal": 1.0,
        },
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
