"""Data-loading benchmark: token-shard loading and text streaming throughput through
build_dataloader.

Each case times batches out of the real loader that build_dataloader returns, drawn as one
continuous stream the way the trainer draws them (collation and epoch starts included,
num_workers=0, one process), one full epoch per run (at least 200 / 1000 batches), and reports
tokens/s (median of three runs); the raw memmap gather of the same windows runs alongside it, so the
ratio shows what the loader costs over the bare read. Goal: shard loading >= 20M tokens/s, so data
is never the bottleneck.

Usage: python tools/bench/bench_data.py [--quick] [--threads N] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from speedtronic_config import DataConfig
from speedtronic_data import build_dataloader, infinite_batches, stdlib_corpus, write_shard

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "data.json"
GOAL = 20e6


@dataclass
class Result:
    case: str
    tokens_per_s: float
    raw_tokens_per_s: float | None  # bare memmap gather of the same windows; None for text
    loader_over_raw: float | None  # raw time / loader time: 1.0 means the loader adds nothing
    batches: int  # batches per timed run: one full epoch, at least --quick's 200 / the default 1000


def _section(**fields) -> DataConfig:
    """A data section whose target batch is one micro-batch (no accumulation)."""
    fields.setdefault("micro_batch_size", 32)
    return DataConfig(
        vocab_size=256,
        num_workers=0,
        drop_last=True,
        seed=0,
        target_batch_size=fields["micro_batch_size"],
        **fields,
    )


def _time_loader(build, batches: int) -> float:
    """Return tokens/s of `batches` batches drawn as the trainer draws them, median of three fresh
    loaders.

    One continuous stream per loader (infinite_batches cycles epochs, like the trainer's
    BatchStream), timed from the first batch on, so the epoch start (shuffle permutation, iterator
    setup, first page touches) is included; main() asks for a full epoch so those weigh as they do
    in training. Building the loader (reading the shard headers) is not timed.
    """
    rates = []
    for _ in range(3):
        stream = infinite_batches(build())
        tokens, start = 0, time.perf_counter()
        for _ in range(batches):
            tokens += next(stream)["input_ids"].numel()
        rates.append(tokens / (time.perf_counter() - start))
    return statistics.median(rates)


def _epoch_batches(tokens: int, block: int, batch: int) -> int:
    """Return the batches in one epoch over `tokens` tokens (windows of block + 1 at stride block,
    drop_last).
    """
    return (tokens - 1) // block // batch


def _time_raw(tokens: np.ndarray, block: int, batch: int, batches: int, shuffle: bool) -> float:
    """Return tokens/s of the bare memmap gather + int64 cast of the same number of windows, median
    of three.
    """
    windows = (len(tokens) - 1) // block
    order = np.random.default_rng(0).permutation(windows) if shuffle else np.arange(windows)
    span, rates = np.arange(block + 1), []
    for _ in range(3):
        start = time.perf_counter()
        for b in range(batches):
            idx = order[(b * batch) % (windows - batch) :][:batch]
            torch.from_numpy(tokens[(idx * block)[:, None] + span].astype(np.int64))
        rates.append(batches * batch * block / (time.perf_counter() - start))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches and a smaller corpus")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    corpus_bytes, batches = (8 << 20, 200) if args.quick else (32 << 20, 1000)
    text = stdlib_corpus(corpus_bytes)
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp:
        shard = write_shard(
            Path(tmp) / "train_000000.bin", np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        )
        tokens = np.memmap(shard, dtype="<u2", mode="r", offset=1024)
        for block, batch in ((128, 32), (1024, 16)):
            count = max(batches, _epoch_batches(len(tokens), block, batch))
            for shuffle in (False, True):
                section = _section(
                    shard_path=str(shard), block_size=block, micro_batch_size=batch, shuffle=shuffle
                )
                rate = _time_loader(lambda section=section: build_dataloader(section), count)
                raw = _time_raw(tokens, block, batch, count, shuffle)
                results.append(
                    Result(
                        f"shards B={batch} T={block} {'shuffled' if shuffle else 'sequential'}",
                        rate,
                        raw,
                        raw and rate / raw,
                        count,
                    )
                )
        text_path = Path(tmp) / "corpus.txt"
        text_path.write_text(text, encoding="utf-8")
        for block, batch in ((128, 32), (1024, 16)):
            section = _section(text_path=str(text_path), block_size=block, micro_batch_size=batch)
            count = max(
                batches, _epoch_batches(len(tokens), block, batch)
            )  # byte tokenizer: a token per byte
            results.append(
                Result(
                    f"text stream B={batch} T={block}",
                    _time_loader(lambda section=section: build_dataloader(section), count),
                    None,
                    None,
                    count,
                )
            )
    print(f"{'case':<36}{'tokens/s':>14}{'raw tokens/s':>16}{'loader/raw':>12}")
    for r in results:
        raw = f"{r.raw_tokens_per_s:>16,.0f}" if r.raw_tokens_per_s else f"{'-':>16}"
        ratio = f"{r.loader_over_raw:>12.2f}" if r.loader_over_raw else f"{'-':>12}"
        goal = (
            ""
            if r.raw_tokens_per_s is None
            else ("  ok" if r.tokens_per_s >= GOAL else "  BELOW 20M GOAL")
        )
        print(f"{r.case:<36}{r.tokens_per_s:>14,.0f}{raw}{ratio}{goal}")
    report = {
        "machine": platform.processor() or platform.machine(),
        "threads": args.threads,
        "torch": torch.__version__,
        "quick": args.quick,
        "goal_tokens_per_s": GOAL,
        "results": [asdict(r) for r in results],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = args.out.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(tmp_out, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
