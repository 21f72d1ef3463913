"""`speedtronic plot`'s reading and output paths (#19: -o DIR reported one path and wrote another;
non-object JSON lines and binary files raised AttributeError / UnicodeDecodeError)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from speedtronic.errors import UsageError
from speedtronic.plotting import iter_metrics, output_path, plot_metrics

PNG = b"\x89PNG\r\n\x1a\n"


def metrics(tmp_path: Path) -> Path:
    path = tmp_path / "run" / "metrics.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    records = [{"event": "train_step", "step": s, "loss": 5.0 / s, "lr": 1e-3} for s in (1, 2, 3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"torn": ')
    return path


def test_output_paths(tmp_path):
    source = tmp_path / "run" / "metrics.jsonl"
    (tmp_path / "folder").mkdir()
    assert output_path(source, None) == tmp_path / "run" / "loss_curve.png"
    assert output_path(source, tmp_path / "folder") == tmp_path / "folder" / "loss_curve.png"
    assert output_path(source, "new/") == Path("new/loss_curve.png")
    assert output_path(source, Path("curve")) == Path("curve.png")
    assert output_path(source, Path("v1.0")) == Path("v1.0.png")
    assert output_path(source, Path("c.svg")) == Path("c.svg")


@pytest.mark.parametrize("output", ["folder", "curve", "c.png"])
def test_the_reported_path_is_the_written_file(tmp_path, output):
    (tmp_path / "folder").mkdir()
    written = plot_metrics(metrics(tmp_path), tmp_path / output)
    assert written.is_file() and written.read_bytes()[:8] == PNG


@pytest.mark.parametrize(
    "content, fragment",
    [
        ('[1, 2]\n{"step": 1, "loss": 2.0}\n', ":1: a JSON list, not a record"),
        ('3\n{"step": 1}\n', ":1: a JSON int, not a record"),
        ("not json\nalso not\n", ":1: not a JSON line"),
    ],
)
def test_lines_that_are_not_records_are_usage_errors(tmp_path, content, fragment):
    path = tmp_path / "m.jsonl"
    path.write_text(content)
    with pytest.raises(UsageError, match=fragment):
        list(iter_metrics(path))


def test_a_missing_source_names_what_to_pass(tmp_path):
    with pytest.raises(UsageError, match="gone: no such file or directory; pass a run directory"):
        plot_metrics(tmp_path / "gone")


def test_a_binary_file_is_a_usage_error(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_bytes(bytes(range(256)))
    with pytest.raises(UsageError, match="not UTF-8 text"):
        plot_metrics(path)


def test_non_numeric_values_are_not_plotted(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": "x", "loss": 1}\n{"step": 1, "loss": "nan?"}\n')
    with pytest.raises(UsageError, match="no training-step records"):
        plot_metrics(path)


def test_a_run_shorter_than_its_logging_interval_is_told_what_to_change(tmp_path):
    # What such a run leaves (logging.every_steps 10, 8 steps): its error named no fix.
    path = tmp_path / "metrics.jsonl"
    records = [
        {"event": "eval", "step": 4, "val_loss": 4.9},
        {"event": "checkpoint", "step": 8, "path": "step_8.pt"},
        {"event": "fit_end", "step": 8, "final_loss": 4.86},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(UsageError) as error:
        plot_metrics(path)
    assert str(error.value) == (
        f"{path}: no training-step records with a loss to plot (a run logs one every "
        "logging.every_steps steps): lower logging.every_steps, or train longer"
    )


def test_a_resumed_run_replaces_its_steps_and_run_averages_stay_out(tmp_path):
    from speedtronic.plotting import _read_series

    records = [
        {"event": "train_step", "step": 1, "loss": 4.0, "tokens_per_s": 10.0},
        {"event": "train_step", "step": 2, "loss": 3.0, "tokens_per_s": 10.0},
        {"event": "train_step", "step": 3, "loss": 2.5, "tokens_per_s": 10.0},  # then killed
        {"event": "train_step", "step": 3, "loss": 2.4, "tokens_per_s": 11.0},  # resumed at 2
        {"event": "eval", "step": 3, "val_loss": 2.6},
        {"event": "fit_end", "step": 3, "tokens_per_s": 99.0, "val_loss": 2.6},
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    series = _read_series(path, None)
    assert series["loss"] == ([1, 2, 3], [4.0, 3.0, 2.4])
    assert series["tokens_per_s"] == ([1, 2, 3], [10.0, 10.0, 11.0])
    assert series["val_loss"] == ([3], [2.6])
    assert _read_series(path, 2)["loss"] == ([1, 2], [4.0, 3.0])


def test_a_large_metrics_file_is_read_streaming(tmp_path):
    # plot read the whole file and every record into memory: 1.9 GB for a 250 MB file.
    import tracemalloc

    from speedtronic.plotting import _read_series

    path = tmp_path / "metrics.jsonl"
    note = "x" * 4000  # a wide record: 20 MB of text for 5,000 steps
    with path.open("w") as handle:
        for step in range(1, 5_001):
            handle.write(json.dumps({"event": "train_step", "step": step, "loss": 1.0, "n": note}))
            handle.write("\n")
    tracemalloc.start()
    try:
        steps, _ = _read_series(path, None)["loss"]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(steps) == 5_000 and peak < 4 * 2**20


def test_far_more_points_than_pixels_are_cut_keeping_every_spike(tmp_path):
    from speedtronic.plotting import MAX_POINTS, _read_series

    path = tmp_path / "metrics.jsonl"
    loss = {step: 2.0 + (step % 7) / 100 for step in range(1, 100_001)}
    loss[43_211], loss[77_777] = 9.0, 0.5  # a spike and a dip, one step each
    path.write_text(
        "".join(
            json.dumps({"event": "train_step", "step": s, "loss": v}) + "\n"
            for s, v in loss.items()
        )
    )
    steps, values = _read_series(path, None)["loss"]
    assert len(steps) <= MAX_POINTS and steps == sorted(steps)
    assert (steps[0], steps[-1]) == (1, 100_000)
    assert {43_211, 77_777} <= set(steps)
    assert all(values[steps.index(s)] == loss[s] for s in steps)
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(MAX_POINTS)))
    assert len(_read_series(path, None)["loss"][0]) == MAX_POINTS  # not cut: the same image


def test_muons_adamw_branch_rate_gets_its_own_line(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    path = tmp_path / "metrics.jsonl"
    records = [
        {"event": "train_step", "step": s, "loss": 1.0, "lr": 1e-3 * s, "lr_adamw": 8e-3 * s}
        for s in (1, 2)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    drawn: list[dict] = []
    save = Figure.savefig

    def savefig(fig, *args, **kwargs):
        rate_axes = fig.axes[1]
        drawn.extend(
            {"label": line.get_label(), "y": list(line.get_ydata())} for line in rate_axes.lines
        )
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    plot_metrics(path)
    assert drawn == [
        {"label": "lr", "y": [1e-3, 2e-3]},
        {"label": "lr_adamw (AdamW branch)", "y": [8e-3, 16e-3]},
    ]


@pytest.mark.parametrize("given", [True, False])
def test_a_target_that_cannot_be_written_is_a_usage_error(tmp_path, monkeypatch, given):
    # As root nothing refuses a write in tmp_path: a folder without write permission, as the
    # figure's own write meets it (the folder exists, so only savefig fails).
    from matplotlib.figure import Figure

    def refused(self, target, **kwargs):
        raise PermissionError(13, "Permission denied", str(target))

    monkeypatch.setattr(Figure, "savefig", refused)
    with pytest.raises(UsageError, match="cannot write there \\(Permission denied\\)") as caught:
        plot_metrics(metrics(tmp_path), tmp_path / "c.png" if given else None)
    assert str(caught.value).startswith("-o " if given else str(tmp_path / "run"))


@pytest.mark.parametrize("literal", ["NaN", "null"])
def test_a_skip_record_plots_alike_as_nan_or_null(tmp_path, literal):
    # Metrics files now write non-finite values as null; older ones hold NaN: both still plot.
    path = metrics(tmp_path)
    path.write_text(
        path.read_text().replace(
            '{"torn": ', f'{{"event": "nonfinite_skip", "step": 4, "loss": {literal}}}\n'
        )
    )
    assert [r["step"] for r in list(iter_metrics(path))] == [1, 2, 3, 4]
    assert plot_metrics(path).read_bytes()[:8] == PNG


def test_a_run_of_one_logged_step_shows_its_point(tmp_path):
    # A line through one point draws nothing: a run stopped after its first step plotted three
    # empty panels. Its lone loss, rate and tokens/s points now show, as markers.
    import matplotlib.image

    path = tmp_path / "metrics.jsonl"
    record = {"event": "train_step", "step": 1, "loss": 4.8, "lr": 1e-3, "tokens_per_s": 900.0}
    path.write_text(json.dumps(record) + "\n")
    pixels = matplotlib.image.imread(plot_metrics(path))[..., :3]

    def drawn(color: tuple[int, int, int]) -> int:  # pixels of a series' colour (no legend)
        return int((abs(pixels - [c / 255 for c in color]).max(axis=-1) < 0.05).sum())

    assert drawn((44, 160, 44)) > 0  # tab:green, the learning rate
    assert drawn((214, 39, 40)) > 0  # tab:red, tokens/s


@contextlib.contextmanager
def as_another_user():
    """Within the block, act as `nobody` when running as root, which reads any file: the
    permission checks a user meets are the system's own, not a mock's.
    """
    if os.geteuid() != 0:
        yield
        return
    # `nobody` cannot read root's site-packages either: what the CLI imports late, imported now.
    import speedtronic_config.errors  # noqa: F401

    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


def test_a_metrics_file_that_cannot_be_read_is_a_usage_error(tmp_path, capsys):
    # It was a PermissionError, exit 1 ("set SPEEDTRONIC_DEBUG=1 for the traceback").
    from speedtronic.cli import main

    path = metrics(tmp_path)
    path.chmod(0)  # as root, the folders above (0700, root's) refuse `nobody` before the file
    with as_another_user():
        assert main(["plot", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("speedtronic plot: ") and err.count("\n") == 1, err
    assert err.endswith(": cannot read it (Permission denied); pass a metrics file you can read\n")
    # The model card reads it alone, and turns a UsageError into a card without its curve.
    with as_another_user(), pytest.raises(UsageError, match=r"cannot read it \(Permission denied"):
        list(iter_metrics(path))


def test_a_run_folder_plots_its_own_metrics_before_a_nested_runs(tmp_path):
    # Sorted by name alone, archive/metrics.jsonl came before the run's own metrics.jsonl.
    from speedtronic.plotting import find_metrics_file

    own = metrics(tmp_path)
    nested = own.parent / "archive" / "metrics.jsonl"
    nested.parent.mkdir()
    nested.write_text(own.read_text())
    assert find_metrics_file(own.parent) == own
    assert find_metrics_file(tmp_path) == own  # the shallowest below the folder given


@pytest.mark.parametrize("stop", [KeyboardInterrupt, OSError(28, "No space left on device")])
def test_a_plot_stopped_while_writing_keeps_the_earlier_image(tmp_path, monkeypatch, stop):
    # savefig wrote straight into the image: Ctrl-C or a full disk left a truncated PNG there.
    from matplotlib.figure import Figure

    def torn(self, target, **kwargs):
        with contextlib.ExitStack() as stack:
            if isinstance(target, (str, os.PathLike)):
                target = stack.enter_context(open(target, "wb"))
            target.write(PNG)  # a head, then the stop
        raise stop

    source = metrics(tmp_path)
    earlier = source.with_name("loss_curve.png")
    earlier.write_bytes(PNG + b"an earlier whole curve")
    monkeypatch.setattr(Figure, "savefig", torn)
    with pytest.raises(KeyboardInterrupt if stop is KeyboardInterrupt else UsageError):
        plot_metrics(source)
    assert earlier.read_bytes() == PNG + b"an earlier whole curve"
    assert sorted(p.name for p in earlier.parent.iterdir()) == ["loss_curve.png", "metrics.jsonl"]
