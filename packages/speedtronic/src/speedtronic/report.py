"""The run summary printed after `speedtronic train`: losses, entropy reference, sample, files."""

from __future__ import annotations

import glob
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from speedtronic.errors import UsageError
from speedtronic_config import ModelConfig


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


# C0 and C1 control characters but newline and tab: a sample from a barely trained model holds
# any byte, and ESC or CR written to a terminal would move, recolour or erase what is on it.
_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0)) if chr(c) not in "\n\t"}


def for_terminal(text: str) -> str:
    """Return text with its control characters (all but newline and tab) written as \\xNN."""
    return text.translate(_ESCAPES)


def _reported(what: str, build: Callable[[], str]) -> str:
    """Return `what: <build()>`, or `what: skipped (<why>)`: a report never fails a finished run."""
    try:
        text = build()
        separator = "" if text.startswith("\n") else " "  # a block below: no trailing space
        return f"{what}:{separator}{text}"
    except Exception as why:  # any reporting failure becomes a note, never an exit 1
        reason = why if isinstance(why, UsageError) else f"{type(why).__name__}: {why}"
        return f"{what}: skipped ({reason})"


def print_run_summary(config: Any, result: Any, checkpoint: Path | None) -> None:
    """Print the final numbers, a generated sample and where the run left its files."""
    from speedtronic.artifacts import sample_text
    from speedtronic.plotting import plot_metrics

    lines = [_trained_line(result)]
    if result.final_loss is not None:
        lines.append(f"final train loss {result.final_loss:.3f} nats/token")
    metrics = result.metrics or {}
    if metrics.get("val_loss") is not None:
        lines.append(_validation_line(config, metrics["val_loss"]))
    if metrics.get("hook_failures"):
        lines.append(
            f"metric hooks failed {metrics['hook_failures']} times (logging went on; see the "
            "warnings above)"
        )
    json_file = Path(config.logging.json_file) if config.logging.json_file else None
    if json_file is not None and json_file.exists():
        lines.append(f"metrics:    {json_file}")
        lines.append(_reported("loss curve", lambda: str(plot_metrics(json_file))))
    if checkpoint is not None:
        lines.append(f"checkpoint: {checkpoint}")
        if config.model.name in ModelConfig.REFERENCE_NAMES:
            vocab = config.model.vocab_size
            lines.append(_reported("sample", lambda: _sample(sample_text, checkpoint, vocab)))
    print("\n".join(lines))
    if math.isnan(result.final_loss or 0.0):
        raise RuntimeError("training ended with a non-finite loss")


def _trained_line(result: Any) -> str:
    """Say what this run did: its own steps, tokens and speed (a resumed run counts from where it
    resumed), or that the target was already reached.
    """
    if result.steps_run == 0:
        return f"nothing to train: already at step {result.steps}; raise --max-steps to go on"
    speed = (result.metrics or {}).get("tokens_per_s", 0.0)
    tokens = round(speed * result.elapsed_s)  # this run's tokens: fit_end's rate x its time
    steps = f"{result.steps_run} steps"
    if result.steps_run != result.steps:
        steps += f" (resumed at step {result.steps - result.steps_run}, now at {result.steps})"
    return f"trained {steps}, {tokens:,} tokens in {result.elapsed_s:.1f}s ({speed:,.0f} tokens/s)"


def _validation_line(config: Any, val_loss: float) -> str:
    line = f"validation loss {val_loss:.3f} nats/token"
    try:
        entropy = (
            unigram_entropy(config.data.val_shard_path) if config.data.val_shard_path else None
        )
    except Exception:  # the reference number is a nicety; the loss is what counts
        entropy = None
    return line if entropy is None else f"{line} (unigram entropy of the corpus: {entropy:.3f})"


# What the summary's sample continues: code (the quickstart's corpus), else sample's own default.
_SUMMARY_PROMPTS = ("def ", "\n")


def _sample(sample_text: Callable[..., str], checkpoint: Path, vocab_size: int) -> str:
    # The first prompt whose bytes the vocabulary holds: a byte-level one cut below "f" (102)
    # refuses "def ", naming a --prompt no one passed; a tokenizer.json's ids all fit (sample
    # checks that), whatever the bytes.
    prompt = next((p for p in _SUMMARY_PROMPTS if max(p.encode()) < vocab_size), None)
    if prompt is None:
        raise UsageError(f"model.vocab_size {vocab_size} holds no byte of text to prompt with")
    text = for_terminal(sample_text(checkpoint, prompt, max_new_tokens=160))
    return "\n" + "\n".join("    " + line for line in text.splitlines())
