from __future__ import annotations

import io
import json
import os
import shutil
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from trainer_testkit import RecordingHook

from speedtronic_trainer import MetricLogger


def test_text_and_jsonl_outputs(tmp_path):
    stream = io.StringIO()
    logger = MetricLogger(
        stream=stream,
        file=str(tmp_path / "logs" / "run.log"),
        json_file=str(tmp_path / "logs" / "run.jsonl"),
    )
    logger.emit("train_step", {"step": 1, "loss": 2.5, "lr": 0.001})
    logger.info("hello %s", "world")
    logger.close()
    text = (tmp_path / "logs" / "run.log").read_text()
    assert "train_step step=1 loss=2.5 lr=0.001" in text and "INFO hello world" in text
    assert text.splitlines() == stream.getvalue().splitlines()
    records = [
        json.loads(line) for line in (tmp_path / "logs" / "run.jsonl").read_text().splitlines()
    ]
    assert len(records) == 1
    assert (
        records[0]["event"] == "train_step" and records[0]["loss"] == 2.5 and "time" in records[0]
    )


def test_level_filters_text_lines():
    stream = io.StringIO()
    logger = MetricLogger(level="warning", stream=stream)
    logger.info("quiet")
    logger.debug("quieter")
    logger.warning("loud %d", 1)
    logger.error("louder")
    assert "quiet" not in stream.getvalue() and "WARNING loud 1" in stream.getvalue()
    assert "ERROR louder" in stream.getvalue()
    assert (
        MetricLogger(level="nonsense", stream=io.StringIO())._level == 20
    )  # unknown names map to INFO


def test_cadence():
    logger = MetricLogger(every_steps=3, stream=io.StringIO())
    assert [s for s in range(1, 10) if logger.wants_step(s)] == [3, 6, 9]
    with pytest.raises(ValueError, match="every_steps"):
        MetricLogger(every_steps=0)


def test_a_failing_hook_keeps_being_called_with_rate_limited_warnings():
    stream = io.StringIO()
    good = RecordingHook()
    calls = []

    def flaky(event, payload):
        calls.append(event)
        if payload["step"] < 25:  # a transient outage: the sink recovers at step 25
            raise RuntimeError("sink is down")

    logger = MetricLogger(stream=stream, hooks=[flaky, good])
    for step in range(30):
        logger.emit("train_step", {"step": step})
    assert len(calls) == 30 and len(good.events) == 30  # never switched off
    warnings = [line for line in stream.getvalue().splitlines() if "sink is down" in line]
    assert len(warnings) == 2 and "(1 failure so far" in warnings[0]  # the 1st and the 10th
    assert "(10 failures so far" in warnings[1]
    assert logger.hook_failures == {
        "test_a_failing_hook_keeps_being_called_with_rate_limited_warnings.<locals>.flaky": 25
    }


def test_failing_hook_never_stops_training():
    from trainer_testkit import TinyLM, make_loader

    from speedtronic_trainer import Trainer

    def bad(event, payload):
        raise ValueError("boom")

    model = TinyLM()
    logger = MetricLogger(stream=io.StringIO(), hooks=[bad])
    trainer = Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        make_loader(),
        device="cpu",
        logger=logger,
    )
    result = trainer.fit(3)
    assert result.steps == 3 and result.metrics["hook_failures"] == 3 + 1  # steps and fit_end


def test_console_metrics_off_keeps_files_and_other_events(tmp_path):
    stream = io.StringIO()
    logger = MetricLogger(stream=stream, file=str(tmp_path / "t.log"))
    logger.console_metrics = False
    logger.emit("train_step", {"step": 1})
    logger.emit("checkpoint", {"step": 1})
    logger.close()
    assert "train_step" not in stream.getvalue() and "checkpoint" in stream.getvalue()
    assert "train_step" in (tmp_path / "t.log").read_text()


def test_close_closes_hooks():
    closed = []
    hook = SimpleNamespace(on_event=lambda e, p: None, close=lambda: closed.append(1))
    MetricLogger(stream=io.StringIO(), hooks=[hook]).close()
    assert closed == [1]


def test_from_config_reads_the_section(tmp_path):
    section = SimpleNamespace(
        level="DEBUG", file=None, json_file=str(tmp_path / "m.jsonl"), every_steps=5, hooks=[]
    )
    logger = MetricLogger.from_config(section)
    assert logger.every_steps == 5 and logger.json_file.endswith("m.jsonl") and logger.hooks == []
    with pytest.raises(ValueError, match="logging.hooks"):
        MetricLogger.from_config(
            SimpleNamespace(
                level="INFO", file=None, json_file=None, every_steps=1, hooks=["mlflow"]
            )
        )


def test_files_deleted_mid_run_are_written_again(tmp_path):
    # Writes to an unlinked file succeed and vanish: every later record was silently lost.
    stream = io.StringIO()
    folder = tmp_path / "logs"
    logger = MetricLogger(
        stream=stream, file=str(folder / "run.log"), json_file=str(folder / "run.jsonl")
    )
    logger.emit("train_step", {"step": 1, "loss": 2.0})
    shutil.rmtree(folder)
    logger.emit("train_step", {"step": 2, "loss": 1.5})
    logger.close()
    records = [json.loads(line) for line in (folder / "run.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2]
    assert "train_step step=2" in (folder / "run.log").read_text()
    assert stream.getvalue().count("was deleted during the run") == 2


def test_records_of_steps_after_a_resume_are_set_aside_and_the_file_stays_in_use(tmp_path):
    path, aside = tmp_path / "metrics.jsonl", tmp_path / "aside" / "superseded.jsonl"
    # Three attempts: 1-6, then 3-4 from an older checkpoint, then steps past the step resumed at
    # (the last one cut short by the crash), and lines without a step.
    lines = [json.dumps({"event": "train_step", "step": s}) for s in (1, 2, 3, 4, 5, 6, 3, 4)]
    lines[5:5] = ['{"event": "diloco/outer_round", "outer_step": 1}', "not json", "[4]"]
    path.write_text("\n".join(lines) + '\n{"event": "train_step", "st')
    logger = MetricLogger(stream=io.StringIO(), json_file=str(path))
    assert logger.set_aside_records_after(2, aside) == 7
    logger.emit("train_step", {"step": 3})
    logger.close()
    kept = path.read_text().splitlines()
    assert kept == [*lines[:2], *lines[5:8], kept[-1]] and json.loads(kept[-1])["step"] == 3
    moved = aside.read_text().splitlines()
    assert moved == [*lines[2:5], *lines[8:], '{"event": "train_step", "st']
    assert MetricLogger(json_file=str(path)).set_aside_records_after(3, aside) == 0
    assert MetricLogger().set_aside_records_after(0, aside) == 0  # no file: nothing to move


def test_a_failed_set_aside_leaves_the_records_in_place(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"event": "train_step", "step": 1}\n{"event": "train_step", "step": 2}\n')
    (tmp_path / "folder").mkdir()
    logger = MetricLogger(stream=io.StringIO(), json_file=str(path))
    with pytest.raises(OSError):
        logger.set_aside_records_after(1, tmp_path / "folder")  # a folder is in the way
    logger.emit("train_step", {"step": 2})
    logger.close()
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 2]


def test_jsonl_records_are_strict_json(tmp_path):
    # json.dumps writes NaN/Infinity, which jq and JSON.parse refuse (the whole file with them).
    path = tmp_path / "metrics.jsonl"
    hook = RecordingHook()
    logger = MetricLogger(stream=io.StringIO(), json_file=str(path), hooks=[hook])
    nan, inf = float("nan"), float("inf")
    logger.emit("eval", {"step": 3, "val_loss": nan, "extra": [1.0, -inf], "n": 2})
    logger.close()

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    record = json.loads(path.read_text(), parse_constant=refuse)
    assert record["val_loss"] is None and record["extra"] == [1.0, None] and record["n"] == 2
    assert hook.events[0][1]["val_loss"] != hook.events[0][1]["val_loss"]  # hooks still get NaN


def test_records_only_drops_the_text_lines_of_this_threads_events_only(tmp_path):
    import threading

    stream, path = io.StringIO(), tmp_path / "m.jsonl"
    logger = MetricLogger(stream=stream, json_file=str(path))
    with logger.records_only():
        logger.emit("nonfinite_skip", {"step": 2})
        # Another thread's event (a DiLoCo upload's) keeps its line meanwhile.
        other = threading.Thread(target=logger.emit, args=("diloco/upload", {"step": 2}))
        other.start()
        other.join()
    logger.emit("nonfinite_skip", {"step": 3})
    logger.close()
    lines = stream.getvalue().splitlines()
    assert [line.split(" INFO ")[1] for line in lines] == [
        "diloco/upload step=2",
        "nonfinite_skip step=3",
    ]
    events = [json.loads(line)["event"] for line in path.read_text().splitlines()]
    assert events == ["nonfinite_skip", "diloco/upload", "nonfinite_skip"]


def test_records_only_nested_keeps_the_outer_block_quiet():
    # A public context: an inner block's exit must not end the outer one's silence.
    stream = io.StringIO()
    logger = MetricLogger(stream=stream)
    with logger.records_only():
        with logger.records_only():
            logger.emit("nonfinite_skip", {"step": 2})
        logger.emit("nonfinite_skip", {"step": 3})
    logger.emit("nonfinite_skip", {"step": 4})
    logger.close()
    assert [line.split(" INFO ")[1] for line in stream.getvalue().splitlines()] == [
        "nonfinite_skip step=4"
    ]


def test_a_record_cut_short_is_dropped_before_appending_so_the_next_starts_its_own_line(tmp_path):
    # A run stopped mid-write left a line without its newline; a later run appending to the same
    # logging.json_file glued its first record onto it, and plot refused the whole file.
    def steps(path):
        return [json.loads(line)["step"] for line in path.read_text().splitlines()]

    path = tmp_path / "metrics.jsonl"
    whole = json.dumps({"event": "train_step", "step": 1, "loss": 2.0}) + "\n"
    path.write_text(whole + '{"event": "train_step", "time": 1.0, "st')
    stream = io.StringIO()
    logger = MetricLogger(stream=stream, json_file=str(path))
    logger.emit("train_step", {"step": 2, "loss": 1.5})
    logger.emit("train_step", {"step": 3, "loss": 1.2})
    logger.close()
    assert steps(path) == [1, 2, 3]
    assert path.read_text().startswith(whole)
    assert f"{path} ended in a record cut short" in stream.getvalue()
    logger = MetricLogger(stream=io.StringIO(), json_file=str(path))  # a whole file: untouched
    logger.emit("train_step", {"step": 4})
    logger.close()
    assert steps(path) == [1, 2, 3, 4]
    # A whole record without its newline (another tool's) is kept: it only gets its newline.
    path.write_text(path.read_text() + json.dumps({"event": "note", "step": 5}))
    stream = io.StringIO()
    logger = MetricLogger(stream=stream, json_file=str(path))
    logger.emit("train_step", {"step": 6})
    logger.close()
    assert steps(path) == [1, 2, 3, 4, 5, 6] and "cut short" not in stream.getvalue()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_json_file_that_is_a_pipe_gets_its_records(tmp_path):
    # logging.json_file may name a pipe (or /dev/stdout): it cannot be read back or cut, so the
    # check for a record cut short is for regular files only.
    fifo = tmp_path / "metrics.fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    reader.start()  # opening a pipe to write waits for its reader
    logger = MetricLogger(stream=io.StringIO(), json_file=str(fifo))
    logger.emit("train_step", {"step": 1})
    logger.emit("train_step", {"step": 2})
    logger.close()
    reader.join()
    assert [json.loads(line)["step"] for line in received[0].splitlines()] == [1, 2]


def test_a_json_file_that_cannot_be_read_back_gets_its_records(tmp_path, monkeypatch):
    # Written but not readable (mode 0200; root reads it anyway, so the refusal is staged): the
    # check of its last line is skipped, not a PermissionError at the first record.
    from speedtronic_trainer import metric_logger

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"event": "train_step", "st')
    real = open

    def write_only(file, mode="r", *args, **kwargs):
        if "r" in mode and Path(file) == path:
            raise PermissionError(13, "Permission denied", str(file))
        return real(file, mode, *args, **kwargs)

    monkeypatch.setattr(metric_logger, "open", write_only, raising=False)
    logger = MetricLogger(stream=io.StringIO(), json_file=str(path))
    logger.emit("train_step", {"step": 1})
    logger.close()
    assert path.read_text().endswith('"step": 1}\n')
