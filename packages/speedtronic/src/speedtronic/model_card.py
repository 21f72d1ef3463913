"""The model card (README.md) of a Hugging Face export: how it was trained, its loss curve."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from speedtronic.errors import UsageError

CARD_NAME = "README.md"
CURVE_NAME = "loss_curve.png"


def find_metrics(config: Any, checkpoint: Path) -> Path | None:
    """Return the run's metrics.jsonl, preferring the one beside the checkpoints folder.

    That one travels with a copied run folder; else logging.json_file, else in run.output_dir.
    """
    candidates = [
        checkpoint.parent.parent / "metrics.jsonl",
        Path(config.logging.json_file) if config.logging.json_file else None,
        Path(config.run.output_dir) / "metrics.jsonl",
    ]
    return next((path for path in candidates if path is not None and path.is_file()), None)


def final_val_loss(records: list[dict[str, Any]], step: int) -> tuple[int, float] | None:
    """Return (step, val_loss) of the last evaluation at or before step, or None; a non-finite
    loss (null in a metrics file, NaN in an older one) is NaN.
    """
    evals = [
        (r["step"], math.nan if r["val_loss"] is None else r["val_loss"])
        for r in records
        if "val_loss" in r and isinstance(r.get("step"), int) and r["step"] <= step
    ]
    return evals[-1] if evals else None


def _architecture(config: Any) -> str:
    m = config.model
    head = "tied embedding and head" if m.tie_weights else "untied head"
    return (
        f"LlamaForCausalLM: {m.n_layer} layers, hidden size {m.d_model}, {m.n_head} attention "
        f"heads ({m.n_kv_head} key/value), MLP {m.d_ff}, vocabulary {m.vocab_size}, context "
        f"{m.max_seq_len}, RoPE theta {m.rope_base:g}, {head}"
    )


def render_card(
    config: Any,
    state: dict[str, Any],
    *,
    tokenizer: str,
    val_loss: tuple[int, float] | None,
    curve: bool,
    repo_id: str | None = None,
) -> str:
    """Return the README.md text: front matter, training summary, loss curve, usage, config."""
    step, tokens = state.get("step"), state.get("tokens")
    where = repo_id or "path/to/this/folder"
    origin = (
        f"continued from `{config.model.init_from}`"
        if config.model.init_from
        else "trained from random initialization"
    )
    opt, sched = config.optimizer, config.scheduler
    branch = "" if opt.adamw_lr is None else f" (its AdamW branch at {opt.adamw_lr:g})"
    rows = [
        ("architecture", _architecture(config)),
        ("tokenizer", tokenizer),
        ("optimizer", f"{opt.name}, lr {opt.lr:g}{branch}, weight decay {opt.weight_decay:g}"),
        ("schedule", f"{sched.name}, {sched.warmup_steps} warmup steps"),
        ("batch", f"{config.data.target_batch_size} sequences of {config.data.block_size} tokens"),
        ("steps", f"{step:,}" if isinstance(step, int) else "unknown"),
        ("tokens", f"{tokens:,}" if isinstance(tokens, int) else "unknown"),
        (
            "final validation loss",
            f"{val_loss[1]:.4f} nats/token (step {val_loss[0]:,})" if val_loss else "not measured",
        ),
    ]
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "tags:",
        "- speedtronic",
        "- llama",
        "- text-generation",
        "---",
        "",
        f"# {config.run.name}",
        "",
        f"A Llama-architecture causal language model {origin} with Speedtronic and exported as a "
        "`transformers` checkpoint: `AutoModelForCausalLM` and `AutoTokenizer` load it with no "
        "custom code.",
        "",
        "| | |",
        "|---|---|",
        *(f"| {name} | {value} |" for name, value in rows),
        "",
    ]
    if curve:
        lines += ["## Loss curve", "", f"![training and validation loss]({CURVE_NAME})", ""]
    lines += [
        "## Use it",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f'tokenizer = AutoTokenizer.from_pretrained("{where}")',
        f'model = AutoModelForCausalLM.from_pretrained("{where}")',
        'ids = tokenizer("def ", return_tensors="pt", add_special_tokens=False).input_ids',
        "out = model.generate(ids, max_new_tokens=64, do_sample=False)",
        "print(tokenizer.decode(out[0]))",
        "```",
        "",
        f"Training saw windows of {config.model.max_seq_len} tokens with no special tokens "
        "added; keep prompt plus generation within that length for the quality it was trained "
        "for.",
        "",
        "## Training configuration",
        "",
        "```yaml",
        config.to_yaml(redact_secrets=True).rstrip("\n"),
        "```",
        "",
    ]
    return "\n".join(lines)


def write_model_card(
    out_dir: Path,
    config: Any,
    state: dict[str, Any],
    *,
    checkpoint: Path,
    tokenizer: Any,
    repo_id: str | None = None,
) -> Path:
    """Write README.md (and loss_curve.png when the run's metrics are found) into out_dir."""
    from speedtronic.plotting import iter_metrics, plot_metrics
    from speedtronic_config.atomic import atomic_write_bytes

    metrics = find_metrics(config, checkpoint)
    step = state.get("step") if isinstance(state.get("step"), int) else 2**63
    curve = out_dir / CURVE_NAME
    try:
        # Only the evaluations final_val_loss reads: a large metrics file is not held in memory.
        records = [r for r in iter_metrics(metrics) if "val_loss" in r] if metrics else []
    except UsageError as error:
        # A damaged metrics file (not UTF-8, a bad line) costs the card its curve and loss, not
        # the export: the weights and tokenizer are already written by now.
        print(f"note: the model card has no loss curve: {error}", file=sys.stderr)
        records, metrics = [], None
    try:
        # Cut at the checkpoint's step: the run may have gone on (resumed) past it.
        plotted = metrics is not None and plot_metrics(metrics, curve, last_step=step) == curve
    except UsageError:  # a run too short to have logged a loss
        plotted = False
    if not plotted:
        curve.unlink(missing_ok=True)
    text = render_card(
        config,
        state,
        tokenizer=tokenizer.describe(),
        val_loss=final_val_loss(records, step),
        curve=plotted,
        repo_id=repo_id,
    )
    target = out_dir / CARD_NAME
    atomic_write_bytes(target, text.encode("utf-8"))
    return target


def is_model_card(path: Path) -> bool:
    """Return whether path is a card write_model_card wrote (its front matter tags speedtronic),
    edited or not; a README.md of the user's own is not.
    """
    try:
        with path.open(encoding="utf-8") as handle:
            head = handle.read(4096)
    except (OSError, UnicodeDecodeError):
        return False
    front, marker, _ = head.removeprefix("---\n").partition("\n---\n")
    return head.startswith("---\n") and bool(marker) and "- speedtronic" in front.splitlines()


__all__ = [
    "CARD_NAME",
    "CURVE_NAME",
    "final_val_loss",
    "find_metrics",
    "is_model_card",
    "render_card",
    "write_model_card",
]
