"""Turn a run's metrics.jsonl into one PNG: loss (and val_loss), learning rate, tokens/s by step."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from speedtronic.errors import UsageError

IMAGE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")


def iter_metrics(path: Path) -> Iterator[dict]:
    """Yield the JSON records of a metrics file one line at a time, skipping a torn last line from
    a killed run: a file of any size is read in constant memory.
    """
    try:
        with path.open(encoding="utf-8") as handle:
            torn = None  # a line that is not JSON: an error unless it is the last
            for number, line in enumerate(handle, start=1):
                if torn is not None:
                    raise UsageError(
                        f"{path}:{torn}: not a JSON line; is this a metrics.jsonl file?"
                    )
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    torn = number
                    continue
                if not isinstance(record, dict):
                    raise UsageError(
                        f"{path}:{number}: a JSON {type(record).__name__}, not a record; is this "
                        "a metrics.jsonl file?"
                    )
                yield record
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text; is this a metrics.jsonl file?") from None
    except OSError as error:
        raise _unreadable(path, error) from None


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


# (event, key) of each curve plot_metrics draws: fit_end's run averages stay out.
PLOTTED = (
    ("train_step", "loss"),
    ("eval", "val_loss"),
    ("train_step", "lr"),
    ("train_step", "lr_adamw"),
    ("train_step", "tokens_per_s"),
)
# Past this many points a curve is cut to each bucket's first, lowest, highest and last point: a
# panel is under 1,000 pixels wide, so the image keeps every spike at a fraction of the drawing.
MAX_POINTS = 8_000
_BUCKETS = MAX_POINTS // 4


def _read_series(
    metrics: Path, last_step: int | None
) -> dict[str, tuple[list[float], list[float]]]:
    """Return {key: (steps, values)} of each PLOTTED key, read streaming: two floats a point are
    kept, not the records.
    """
    from array import array

    points = {key: (array("d"), array("d")) for _, key in PLOTTED}
    for r in iter_metrics(metrics):
        step = r.get("step")
        if not isinstance(step, (int, float)) or (last_step is not None and step > last_step):
            continue
        for event, key in PLOTTED:
            value = r.get(key)
            if isinstance(value, (int, float)) and r.get("event", event) == event:
                points[key][0].append(step)
                points[key][1].append(value)
    return {key: _latest_per_step(steps, values) for key, (steps, values) in points.items()}


def _latest_per_step(steps: Any, values: Any) -> tuple[list[float], list[float]]:
    """Return (steps, values): one point per step, the last logged, in step order, cut to at most
    MAX_POINTS (_decimate). A run resumed from an earlier step, or a rerun appending to the same
    file, replaces those points instead of drawing back over them.
    """
    import numpy as np

    steps, values = np.asarray(steps), np.asarray(values)
    # The last of each step: the first in the reversed arrays.
    unique, first = np.unique(steps[::-1], return_index=True)
    values = values[::-1][first]
    keep = _decimate(values)
    return unique[keep].tolist(), values[keep].tolist()


def _decimate(values: Any) -> Any:
    """Return the indices to draw of values: all of them up to MAX_POINTS, else the first,
    lowest, highest and last of each of _BUCKETS runs of points, in order.
    """
    import numpy as np

    n = len(values)
    if n <= MAX_POINTS:
        return np.arange(n)
    width = -(-n // _BUCKETS)
    buckets = np.pad(values, (0, _BUCKETS * width - n), mode="edge").reshape(_BUCKETS, width)
    starts = np.arange(_BUCKETS) * width
    picks = (starts, starts + buckets.argmin(axis=1), starts + buckets.argmax(axis=1))
    return np.unique(np.minimum(np.concatenate((*picks, starts + width - 1)), n - 1))


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
        raise UsageError(
            f"{source}: no such file or directory; pass a run directory or its metrics.jsonl"
        )
    return source


def plot_metrics(
    source: Path, output: str | Path | None = None, *, last_step: int | None = None
) -> Path:
    """Write the loss / learning-rate / throughput figure and return its path; with last_step,
    only the records up to that step (a checkpoint's, when the run went on past it).
    """
    metrics = find_metrics_file(source)
    series = _read_series(metrics, last_step)
    steps, loss = series["loss"]
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
    val_steps, val_loss = series["val_loss"]
    if val_steps:
        ax_loss.plot(val_steps, val_loss, "o-", label="val loss", color="tab:orange")
    ax_loss.set_ylabel("loss (nats/token)")
    ax_loss.legend()
    ax_loss.grid(alpha=0.3)
    adamw_steps, adamw_lr = series["lr_adamw"]
    # With optimizer.adamw_lr, Muon's matrices and its AdamW branch follow two rates.
    _draw(ax_lr, *series["lr"], color="tab:green", label="lr" if adamw_steps else None)
    if adamw_steps:
        _draw(ax_lr, adamw_steps, adamw_lr, color="tab:purple", label="lr_adamw (AdamW branch)")
        ax_lr.legend()
    ax_lr.set_ylabel("learning rate")
    ax_lr.grid(alpha=0.3)
    _draw(ax_tps, *series["tokens_per_s"], color="tab:red")
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
