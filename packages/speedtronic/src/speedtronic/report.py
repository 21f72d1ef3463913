"""The run summary printed after `speedtronic train`: losses, entropy reference, sample, files."""

from __future__ import annotations

import glob
import math
from pathlib import Path
from typing import Any

import numpy as np

from speedtronic.errors import UsageError


def unigram_entropy(shard_glob: str) -> float | None:
    """Return the unigram (byte-frequency) entropy in nats/token of the shards matching
    shard_glob.
    """
    from speedtronic_data import read_shard_tokens

    paths = sorted(glob.glob(shard_glob))
    if not paths:
        return None
    counts = sum(np.bincount(read_shard_tokens(p), minlength=1 << 16) for p in paths)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def print_run_summary(config: Any, result: Any, checkpoint: Path | None) -> None:
    """Print the final numbers, a generated sample and where the run left its files."""
    from speedtronic.artifacts import sample_text
    from speedtronic.plotting import plot_metrics

    lines = [
        f"trained {result.steps} steps, {result.tokens:,} tokens in {result.elapsed_s:.1f}s"
        f" ({result.tokens / max(result.elapsed_s, 1e-9):,.0f} tokens/s)"
    ]
    if result.final_loss is not None:
        lines.append(f"final train loss {result.final_loss:.3f} nats/token")
    val_loss = (result.metrics or {}).get("val_loss")
    if val_loss is not None:
        entropy = (
            unigram_entropy(config.data.val_shard_path)
            if getattr(config.data, "val_shard_path", None)
            else None
        )
        reference = (
            f" (unigram entropy of the corpus: {entropy:.3f})" if entropy is not None else ""
        )
        lines.append(f"validation loss {val_loss:.3f} nats/token{reference}")
    metrics = Path(config.logging.json_file) if config.logging.json_file else None
    if metrics is not None and metrics.exists():
        lines.append(f"metrics:    {metrics}")
        try:
            lines.append(f"loss curve: {plot_metrics(metrics)}")
        except UsageError as why:  # e.g. a run shorter than logging.every_steps
            lines.append(f"loss curve: skipped ({why})")
        except OSError as why:  # a full disk must not fail a run whose checkpoint is written
            lines.append(f"loss curve: not written ({why.strerror or why})")
    if checkpoint is not None:
        lines.append(f"checkpoint: {checkpoint}")
        if config.model.name == "reference_transformer":
            sample = sample_text(checkpoint, "def ", max_new_tokens=160)
            lines.append("sample:\n" + "\n".join("    " + s for s in sample.splitlines()))
    print("\n".join(lines))
    if math.isnan(result.final_loss or 0.0):
        raise RuntimeError("training ended with a non-finite loss")
