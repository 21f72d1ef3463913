"""Trainer overhead: speedtronic_trainer.Trainer tokens/s against a minimal hand-written PyTorch
loop.

Both run the same reference model, data, AdamW and step count, interleaved round by round in one
process, the one that runs first alternating (machines are noisy, so only the paired ratio is
meaningful). Prints a table and writes tools/bench/results/trainer.json.

Usage: python tools/bench/bench_trainer.py [--steps 30] [--rounds 5] [--device cpu] [--out PATH]
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from benchlib import interleaved, machine_info, median_ratio, write_json
from speedtronic_config import SpeedtronicConfig
from speedtronic_model.model import ReferenceTransformer
from speedtronic_trainer import MetricLogger, Trainer

RESULTS = Path(__file__).resolve().parent / "results" / "trainer.json"
MODEL = {"vocab_size": 512, "block_size": 64, "n_layer": 2, "n_head": 4, "d_model": 128}
MICRO_BATCH, ACCUMULATION = 8, 2


class Tokens(Dataset):
    def __init__(self, n: int = 512) -> None:
        self.tokens = torch.randint(
            0,
            MODEL["vocab_size"],
            (n, MODEL["block_size"] + 1),
            generator=torch.Generator().manual_seed(0),
        )

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i, :-1], "labels": self.tokens[i, 1:]}


def setup(device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer, DataLoader]:
    torch.manual_seed(0)
    model = ReferenceTransformer(**MODEL).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    return (
        model,
        optimizer,
        DataLoader(Tokens(), batch_size=MICRO_BATCH, shuffle=True, drop_last=True),
    )


def run_trainer(steps: int, device: torch.device) -> float:
    model, optimizer, loader = setup(device)
    trainer = Trainer(
        model,
        optimizer,
        loader,
        device=device,
        config=SpeedtronicConfig.from_dict(
            {
                "data": {
                    "micro_batch_size": MICRO_BATCH,
                    "target_batch_size": MICRO_BATCH * ACCUMULATION,
                },
                "logging": {"progress": False},
            }
        ),
        logger=MetricLogger(stream=io.StringIO(), every_steps=10),
    )
    result = trainer.fit(steps)
    return result.tokens / result.elapsed_s


def run_manual(steps: int, device: torch.device) -> float:
    """The loop anyone would write by hand: no checkpoints, no metrics beyond the loss."""
    model, optimizer, loader = setup(device)
    model.train()
    batches, tokens = iter(loader), 0
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(ACCUMULATION):
            try:
                batch = next(batches)
            except StopIteration:
                batches = iter(loader)
                batch = next(batches)
            batch = {k: v.to(device) for k, v in batch.items()}
            loss = model(**batch)["loss"] / ACCUMULATION
            loss.backward()
            total += loss.detach()
            tokens += batch["input_ids"].numel()
        optimizer.step()
        float(total)  # the loss a real loop would print
    return tokens / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    (
        run_trainer(3, device),
        run_manual(3, device),
    )  # warm-up: allocator, kernels, the peak-FLOPs probe
    # Rotating order: a side that always ran second would inherit the first one's warm caches.
    rates = interleaved(
        {
            "trainer": lambda: run_trainer(args.steps, device),
            "manual": lambda: run_manual(args.steps, device),
        },
        args.rounds,
    )
    trainer, manual = rates["trainer"], rates["manual"]
    ratios = [t / m for t, m in zip(trainer, manual, strict=True)]
    result = {
        "benchmark": "trainer_overhead",
        "device": str(device),
        "torch": torch.__version__,
        "machine": machine_info(),
        "threads": torch.get_num_threads(),
        "model": MODEL,
        "micro_batch": MICRO_BATCH,
        "accumulation": ACCUMULATION,
        "steps": args.steps,
        "rounds": args.rounds,
        "trainer_tokens_per_s": trainer,
        "manual_tokens_per_s": manual,
        "median_trainer_tokens_per_s": statistics.median(trainer),
        "median_manual_tokens_per_s": statistics.median(manual),
        "ratio_per_round": ratios,
        "median_ratio": median_ratio(trainer, manual),
        "goal": 0.97,
    }
    print(f"{'round':>5} {'trainer tok/s':>14} {'manual tok/s':>13} {'ratio':>7}")
    for i, (t, m, r) in enumerate(zip(trainer, manual, ratios, strict=True), 1):
        print(f"{i:>5} {t:>14,.0f} {m:>13,.0f} {r:>7.3f}")
    print(
        f"{'median':>5} {result['median_trainer_tokens_per_s']:>14,.0f} "
        f"{result['median_manual_tokens_per_s']:>13,.0f} {result['median_ratio']:>7.3f}   (goal >= "
        "0.97)"
    )
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
