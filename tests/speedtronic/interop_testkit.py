"""Shared helpers of the Hugging Face interop tests: a tiny run config and a varied checkpoint."""

from __future__ import annotations

from pathlib import Path

BPE_CORPUS = (
    "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int = 0\n    y: int = 0\n" * 40
)


def run_config(run_dir: Path, shards: Path, **model) -> dict:
    """A tiny reference-transformer run over shards, writing into run_dir."""
    return {
        "run": {"name": "hf-interop", "device": "cpu", "max_steps": 4, "output_dir": str(run_dir)},
        "model": {
            "vocab_size": 300,
            "max_seq_len": 32,
            "n_layer": 2,
            "n_head": 4,
            "n_kv_head": 2,
            "d_model": 32,
            **model,
        },
        "data": {
            "shard_path": str(shards / "train_*.bin"),
            "val_shard_path": str(shards / "val_*.bin"),
            "micro_batch_size": 2,
            "target_batch_size": 2,
            "eval_every": 2,
            "eval_steps": 2,
        },
        "optimizer": {"name": "adamw", "lr": 0.003},
        "scheduler": {"warmup_steps": 1},
        "precision": "fp32",
        "checkpoint": {"every_steps": 2},
        "logging": {"json_file": str(run_dir / "metrics.jsonl")},
    }


def noisy_checkpoint(config: dict, step: int = 0, noise: float = 0.3) -> Path:
    """Build the run, push its weights far from init (varied greedy output: ids past 255, invalid
    UTF-8), and save it as a trainer checkpoint at `step`; return the checkpoint path.
    """
    import torch

    from speedtronic.runtime import build_runtime

    trainer, manager = build_runtime(config)
    try:
        with torch.no_grad():
            generator = torch.Generator().manual_seed(11)
            for param in trainer.model.parameters():
                param.add_(torch.randn(param.shape, generator=generator) * noise)
        trainer.step = step
        return manager.save(step, trainer.state_dict())
    finally:
        trainer.close()


def prepare(folder: Path, tokenizer_json: Path | None) -> Path:
    """Prepare (again) folder's train/val shards of the BPE corpus, with a tokenizer.json or
    the byte tokenizer; return folder.
    """
    import shutil

    from speedtronic_data import JsonTokenizer, prepare_shards

    shutil.rmtree(folder, ignore_errors=True)  # prepare refuses shards of another tokenizer
    tokenizer = JsonTokenizer.from_file(tokenizer_json) if tokenizer_json else None
    prepare_shards([], folder, tokenizer, val_fraction=0.1, texts=[BPE_CORPUS], progress=None)
    return folder
