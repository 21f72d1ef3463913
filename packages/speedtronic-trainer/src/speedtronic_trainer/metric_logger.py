"""MetricLogger: level-filtered text lines, JSONL records and hook delivery for training events."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import stat
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from speedtronic_config import LoggingConfig, resolve_section
from speedtronic_config.atomic import atomic_write_bytes
from speedtronic_trainer.hooks import deliver, hook_name
from speedtronic_trainer.progress import write_beside_bars

_DEFAULTS = LoggingConfig()
_LEVELS = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
}


def _last_line(path: str | os.PathLike[str], end: int) -> tuple[int, bytes]:
    """Return (where the file's last line starts, its bytes up to `end`), reading back from the
    end a block at a time: the file may be large.
    """
    keep = end
    with open(path, "rb") as reader:
        while keep > 0:
            start = max(0, keep - 4096)
            reader.seek(start)
            newline = reader.read(keep - start).rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            keep = start
        reader.seek(keep)
        return keep, reader.read(end - keep)


@dataclass
class MetricLogger:
    """Write level-filtered text lines, JSONL records and hook events; hook failures never stop
    training.
    """

    level: str = _DEFAULTS.level
    file: str | None = _DEFAULTS.file
    json_file: str | None = _DEFAULTS.json_file
    every_steps: int = _DEFAULTS.every_steps
    stream: TextIO | None = None
    hooks: list[Any] = field(default_factory=list)
    console_metrics: bool = (
        True  # the trainer turns this off while a progress bar owns the terminal
    )

    def __post_init__(self) -> None:
        # LoggingConfig owns the rules for these values (a ConfigError names logging.<field>).
        LoggingConfig(level=self.level, every_steps=self.every_steps)
        self._level = _LEVELS.get(str(self.level).upper(), logging.INFO)
        self.stream = sys.stdout if self.stream is None else self.stream
        self._lock = threading.Lock()
        self._records_only = threading.local()  # set on the thread inside records_only()
        self._text = self._open(self.file)
        self._json = self._open(self.json_file)
        self._json_end_checked = False  # set once the first record checked the file's end
        self.hook_failures: dict[str, int] = {}  # hook name -> failed deliveries, for the summary

    @classmethod
    def from_config(
        cls,
        section: Any,
        *,
        hooks: list[Any] | None = None,
        hook_dir: str = "runs",
        resume: bool = False,
    ) -> MetricLogger:
        """Build a logger from a LoggingConfig-like section, including its `hooks` names
        (tensorboard, wandb); `resume`: the run continues from a checkpoint under hook_dir.
        """
        # Integrations import optional packages: only when a section names them.
        from speedtronic_trainer.integrations import hooks_from_names

        section = resolve_section(section, "logging")
        built = list(hooks or []) + hooks_from_names(section.hooks, log_dir=hook_dir, resume=resume)
        return cls(
            level=section.level,
            file=section.file,
            json_file=section.json_file,
            every_steps=section.every_steps,
            hooks=built,
        )

    @staticmethod
    def _open(name: str | None) -> TextIO | None:
        if name is None:
            return None
        path = Path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("a", encoding="utf-8")

    def _reopen_if_deleted(self, handle: TextIO | None, name: str | None) -> TextIO | None:
        """Return handle, or a new file in its place when its file (or folder) was deleted
        mid-run: writes to an unlinked file succeed and vanish, losing every later record.
        """
        if handle is None or name is None or os.fstat(handle.fileno()).st_nlink:
            return handle
        handle.close()
        reopened = self._open(name)
        if self.stream is not None:
            self.stream.write(
                f"{time.strftime('%Y-%m-%d %H:%M:%S')} WARNING {name} was deleted during the "
                "run; writing to a new file from here on (the earlier lines are gone)\n"
            )
        return reopened

    def _end_last_record(self, handle: TextIO) -> None:
        """Before the first record goes to the JSONL file, end a last line left without its
        newline: appended to, it swallowed this run's first record, and plot and the model card
        refused the whole file. A whole record (written by another tool) gets its newline; a
        write a stopped run cut short, which no reader can parse, is dropped, and said.
        """
        self._json_end_checked = True
        status = os.fstat(handle.fileno())
        if not stat.S_ISREG(status.st_mode):  # a pipe or device (/dev/stdout): nothing to read
            return
        end = status.st_size
        try:
            keep, last = _last_line(self.json_file, end)  # type: ignore[arg-type]
        except OSError:  # written but not readable back (mode 0200): left as it is
            return
        if not last:
            return
        try:
            json.loads(last)
        except ValueError:  # UnicodeDecodeError included
            os.ftruncate(handle.fileno(), keep)
            self._write_text(
                logging.WARNING,
                f"{self.json_file} ended in a record cut short (a run stopped while writing it); "
                f"dropped its {end - keep} bytes so this run's records start on their own line",
            )
            return
        handle.write("\n")

    def set_aside_records_after(self, step: int, destination: str | os.PathLike[str]) -> int:
        """Move the JSONL file's records of steps after `step` to `destination`; return how many
        lines moved (0: nothing written).

        For a run resumed from its checkpoint of `step`: it logs the later steps again, so the
        records an earlier attempt wrote for them (before a crash, or past an older checkpoint)
        would stand twice. A last line without its newline (a write the crash cut short) moves
        too; lines without a step stay. `destination` is written first, then the file is
        replaced atomically: a failure leaves the file as it was.
        """
        with self._lock:
            if self._json is None:
                return 0
            self._json.flush()
            path = Path(self.json_file)  # type: ignore[arg-type]
            *lines, cut_short = path.read_bytes().split(b"\n")
            kept, moved = bytearray(), bytearray()
            for line in lines:
                (moved if _record_step(line) > step else kept).extend(line + b"\n")
            if cut_short:
                moved.extend(cut_short + b"\n")
            if not moved:
                return 0
            atomic_write_bytes(destination, bytes(moved))
            try:
                atomic_write_bytes(path, bytes(kept))
            except BaseException:
                Path(destination).unlink(missing_ok=True)  # the records are all still in place
                raise
            # The open handle appends to the replaced file: write to the new one from here on.
            self._json.close()
            self._json = self._open(self.json_file)
            return moved.count(b"\n")

    def resumed_at(self, step: int) -> None:
        """Tell every hook with a resumed_at(step) method that the run resumed from its
        checkpoint of `step` (TensorBoard then drops an earlier attempt's later steps).
        """
        self._call_hooks("resumed_at", step)

    def log_config(self, values: dict[str, Any]) -> None:
        """Give every hook with a log_config(values) method the run's configuration (the
        secret-free one its checkpoints record): W&B's run config, TensorBoard's hparams.
        """
        self._call_hooks("log_config", values)

    def _call_hooks(self, method: str, *args: Any) -> None:
        """Call `method` on every hook that has it; a failure is counted, never raised."""
        with self._lock:
            for hook in self.hooks:
                call = getattr(hook, method, None)
                if not callable(call):
                    continue
                try:
                    call(*args)
                except Exception as exc:  # a metrics sink must never end a training run
                    self._hook_failed(hook, method, exc)

    def wants_step(self, step: int) -> bool:
        """Return True when a train_step record for `step` is due under every_steps."""
        return step % self.every_steps == 0

    def emit(self, event: str, payload: dict[str, Any]) -> None:
        """Record one event as a text line, a JSONL record and a hook call."""
        with self._lock:
            self._emit_locked(event, payload)

    @contextlib.contextmanager
    def records_only(self) -> Iterator[None]:
        """Within the block, events this thread emits get their JSONL record and hook calls but no
        text line. A context, not an emit() argument: a 2.0 subclass's emit(event, payload) and
        _emit_locked(event, payload) overrides keep working.
        """
        outer = getattr(self._records_only, "active", False)  # nested: the outer block's state
        self._records_only.active = True
        try:
            yield
        finally:
            self._records_only.active = outer

    def _emit_locked(self, event: str, payload: dict[str, Any]) -> None:
        if not getattr(self._records_only, "active", False):
            line = f"{event} {_format_metrics(payload)}"
            console = self.console_metrics or event != "train_step"
            self._write_text(logging.INFO, line, console=console)
        self._json = self._reopen_if_deleted(self._json, self.json_file)
        if self._json is not None and not self._json_end_checked:
            self._end_last_record(self._json)
        if self._json is not None:
            record = _strict_json({"event": event, "time": time.time(), **payload})
            self._json.write(json.dumps(record, default=str, allow_nan=False) + "\n")
            self._json.flush()
        for hook in self.hooks:
            try:
                deliver(hook, event, payload)
            except Exception as exc:  # a metrics sink must never end a training run
                self._hook_failed(hook, event, exc)

    def _hook_failed(self, hook: Any, event: str, exc: Exception) -> None:
        """Count a failed delivery; warn on the 1st, 10th, 100th... so a broken sink cannot flood
        the log, and keep calling it (a transient W&B or TensorBoard error must not end logging).
        """
        name = hook_name(hook)
        count = self.hook_failures[name] = self.hook_failures.get(name, 0) + 1
        if str(count).rstrip("0") == "1":  # the 1st, 10th, 100th ... failure
            self._write_text(
                logging.WARNING,
                f"hook {name} failed on {event!r} ({count} failure{'s' if count > 1 else ''} so "
                f"far; still called): {type(exc).__name__}: {exc}",
                console=True,
            )

    def _write_text(self, level: int, message: str, *, console: bool = True) -> None:
        if level < self._level:
            return
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {logging.getLevelName(level)} {message}\n"
        if console and self.stream is not None:
            write_beside_bars(self.stream, line)
        self._text = self._reopen_if_deleted(self._text, self.file)
        if self._text is not None:
            self._text.write(line)
            self._text.flush()

    def log(self, level: int, message: str) -> None:
        """Write one text line at `level` when it passes the configured level."""
        with self._lock:
            self._write_text(level, message)

    def debug(self, message: str, *args: Any) -> None:
        """Log at DEBUG, %-formatting args."""
        self.log(logging.DEBUG, message % args if args else message)

    def info(self, message: str, *args: Any) -> None:
        """Log at INFO, %-formatting args."""
        self.log(logging.INFO, message % args if args else message)

    def warning(self, message: str, *args: Any) -> None:
        """Log at WARNING, %-formatting args."""
        self.log(logging.WARNING, message % args if args else message)

    def error(self, message: str, *args: Any) -> None:
        """Log at ERROR, %-formatting args."""
        self.log(logging.ERROR, message % args if args else message)

    def close(self) -> None:
        """Close files and every hook that has a close() method."""
        with self._lock:
            for handle in (self._text, self._json):
                if handle is not None:
                    handle.close()
            self._text = self._json = None
            for hook in self.hooks:
                close = getattr(hook, "close", None)
                if callable(close):
                    try:
                        close()
                    except Exception as exc:  # closing a sink is best-effort too
                        self._write_text(
                            logging.WARNING, f"hook {hook_name(hook)} failed to close: {exc}"
                        )


def _record_step(line: bytes) -> float:
    """Return the integer `step` of a JSONL record line; -inf for any other line."""
    try:
        record = json.loads(line)
    except ValueError:
        return -math.inf
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else -math.inf


def _strict_json(value: Any) -> Any:
    """Return value with every NaN/inf float (in dicts, lists, tuples) as None: json.dumps would
    write NaN/Infinity, which is not JSON (jq and JSON.parse refuse the whole file).
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _strict_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict_json(item) for item in value]
    return value


def _format_metrics(metrics: dict[str, Any]) -> str:
    """Return metrics as one line of key=value pairs, floats to 6 significant digits."""
    parts = []
    for key, value in metrics.items():
        if isinstance(value, float):
            parts.append(f"{key}={value:.6g}")
        else:
            parts.append(f"{key}={value}")
    return " ".join(parts)


__all__ = ["MetricLogger"]
