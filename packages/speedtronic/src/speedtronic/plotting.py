"""Turn a run's metrics.jsonl into one PNG: loss (and val_loss), learning rate, tokens/s by step."""

from __future__ import annotations

import json
import os
from pathlib import Path

from speedtronic.errors import UsageError

IMAGE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")


def read_metrics(path: Path) -> list[dict]:
    """Return the JSON records of a metrics file, skipping a torn last line from a killed run."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text; is this a metrics.jsonl file?") from None
    except OSError as error:
        raise _unreadable(path, error) from None
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number < len(lines):
                raise UsageError(
                    f"{path}:{number}: not a JSON line; is this a metrics.jsonl file?"
                ) from None
            continue
        if not isinstance(record, dict):
            raise UsageError(
                f"{path}:{number}: a JSON {type(record).__name__}, not a record; is this a "
                "metrics.jsonl file?"
            )
        records.append(record)
    return records


def output_path(metrics: Path, output: str | Path | None) -> Path:
    """Return the file the figure goes to: `output`, inside it when it is a folder (or ends with
    a separator), with .png added when it names no image format; by default loss_curve.png beside
    the metrics.
    """
    if output is None:
        return metrics.with_name("loss_curve.png")
    folder = str(output).endswith(("/", os.sep))
    output = Path(output)
    if folder or output.is_dir():
        return output / "loss_curve.png"
    if output.suffix.lower() not in IMAGE_SUFFIXES:
        return output.with_name(output.name + ".png")  # what matplotlib would write anyway
    return output


def _series(
    records: list[dict], key: str, event: str = "train_step"
) -> tuple[list[float], list[float]]:
    """Return (steps, values) of `key` in `event` records: one point per step, the last logged,
    in step order. A run resumed from an earlier step, or a rerun appending to the same file,
    replaces those points instead of drawing back over them; fit_end's run averages stay out.
    """
    latest: dict[float, float] = {}
    for r in records:
        value, step = r.get(key), r.get("step")
        if r.get("event", event) == event and isinstance(value, (int, float)):
            if isinstance(step, (int, float)):
                latest[step] = value
    steps = sorted(latest)
    return steps, [latest[s] for s in steps]


def _draw(axes, steps: list[float], values: list[float], **style) -> None:
    """Plot a series on `axes`; a lone point gets a marker (a line through one point draws
    nothing: a run stopped after its first logged step would show empty panels).
    """
    axes.plot(steps, values, marker="o" if len(steps) == 1 else None, **style)


def _unreadable(path: Path, error: OSError) -> UsageError:
    """Return the error for a metrics file, or a folder on its way, that cannot be read."""
    return UsageError(
        f"{error.filename or path}: cannot read it ({error.strerror or error}); pass a metrics "
        "file you can read"
    )


def find_metrics_file(source: Path) -> Path:
    """Return the metrics.jsonl inside a run directory, or the file itself."""
    try:
        is_dir = source.is_dir()
    except OSError as error:  # no permission to look into a folder on its way
        raise _unreadable(source, error) from None
    if is_dir:
        candidates = list(source.rglob("metrics.jsonl"))
        if not candidates:
            raise UsageError(
                f"{source}: no metrics.jsonl inside; pass the run directory of a finished run"
            )
        # The shallowest: a run folder's own file, not one in a subfolder that sorts first.
        return min(candidates, key=lambda path: (len(path.parts), path))
    if not source.exists():
        raise UsageError(f"{source}: no such file or directory")
    return source


def plot_metrics(
    source: Path, output: str | Path | None = None, *, last_step: int | None = None
) -> Path:
    """Write the loss / learning-rate / throughput figure and return its path; with last_step,
    only the records up to that step (a checkpoint's, when the run went on past it).
    """
    metrics = find_metrics_file(source)
    records = read_metrics(metrics)
    if last_step is not None:
        records = [r for r in records if isinstance(r.get("step"), (int, float))]
        records = [r for r in records if r["step"] <= last_step]
    steps, loss = _series(records, "loss")
    if not steps:
        raise UsageError(
            f"{metrics}: no training-step records with a loss to plot (a run logs one every "
            "logging.every_steps steps): lower logging.every_steps, or train longer"
        )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_lr, ax_tps) = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    _draw(ax_loss, steps, loss, label="train loss", color="tab:blue")
    val_steps, val_loss = _series(records, "val_loss", "eval")
    if val_steps:
        ax_loss.plot(val_steps, val_loss, "o-", label="val loss", color="tab:orange")
    ax_loss.set_ylabel("loss (nats/token)")
    ax_loss.legend()
    ax_loss.grid(alpha=0.3)
    adamw_steps, adamw_lr = _series(records, "lr_adamw")
    # With optimizer.adamw_lr, Muon's matrices and its AdamW branch follow two rates.
    _draw(ax_lr, *_series(records, "lr"), color="tab:green", label="lr" if adamw_steps else None)
    if adamw_steps:
        _draw(ax_lr, adamw_steps, adamw_lr, color="tab:purple", label="lr_adamw (AdamW branch)")
        ax_lr.legend()
    ax_lr.set_ylabel("learning rate")
    ax_lr.grid(alpha=0.3)
    _draw(ax_tps, *_series(records, "tokens_per_s"), color="tab:red")
    ax_tps.set_ylabel("tokens / s")
    ax_tps.set_xlabel("optimizer step")
    ax_tps.grid(alpha=0.3)
    fig.suptitle(f"Speedtronic run: {metrics.parent.name}")
    fig.tight_layout()
    target = output_path(metrics, output)
    from speedtronic_config.atomic import atomic_write, unwritable_reason

    image = target.suffix[1:].lower()
    try:
        # Through a temp file: Ctrl-C or a full disk while writing keeps an earlier image whole.
        atomic_write(target, lambda handle: fig.savefig(handle, format=image, dpi=110))
    except OSError as error:  # a folder without write permission fails here
        where = f"-o {target}" if output is not None else str(target)
        fix = (
            "choose a writable folder"
            if output is not None
            else "pass -o OUT.png to write it elsewhere"
        )
        reason = unwritable_reason(target.parent, error)
        raise UsageError(f"{where}: cannot write there ({reason}); {fix}") from None
    finally:
        plt.close(fig)
    return target
