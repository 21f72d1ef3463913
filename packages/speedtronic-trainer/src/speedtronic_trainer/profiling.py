"""Lightweight text/JSONL metrics and pluggable training hooks."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

import torch

Metric = dict[str, Any]
Hook = Callable[[str, Metric], None]

_LEVELS = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
}


class TrainingHook(Protocol):
    def on_event(self, event: str, payload: dict[str, Any]) -> None: ...


def memory_usage_bytes() -> int | None:
    """Return allocated accelerator memory when the backend exposes it."""
    if torch.cuda.is_available():
        return int(torch.cuda.memory_allocated())
    mps = getattr(torch, "mps", None)
    if mps is not None and torch.backends.mps.is_available():
        return int(mps.current_allocated_memory())
    return None


def _deliver(hook: Any, event: str, payload: Metric) -> None:
    if hasattr(hook, "on_event"):
        hook.on_event(event, payload)
    else:
        hook(event, payload)


def _hook_name(hook: Any) -> str:
    return getattr(hook, "__qualname__", None) or type(hook).__name__


@dataclass
class MetricLogger:
    """Write level-filtered text lines, JSONL records and hook events; hook failures never stop
    training.
    """

    level: str = "INFO"
    file: str | None = None
    json_file: str | None = None
    every_steps: int = 1
    stream: TextIO | None = None
    hooks: list[Any] = field(default_factory=list)
    console_metrics: bool = (
        True  # the trainer turns this off while a progress bar owns the terminal
    )

    def __post_init__(self) -> None:
        if self.every_steps <= 0:
            raise ValueError(
                f"logging every_steps must be a positive integer, got {self.every_steps!r}"
            )
        self._level = _LEVELS.get(str(self.level).upper(), logging.INFO)
        self.stream = sys.stdout if self.stream is None else self.stream
        self._lock = threading.Lock()
        self._text = self._open(self.file)
        self._json = self._open(self.json_file)
        self._failed_hooks: set[int] = set()

    @classmethod
    def from_config(
        cls, section: Any, *, hooks: list[Any] | None = None, hook_dir: str = "runs"
    ) -> MetricLogger:
        """Build a logger from a LoggingConfig-like section, including its `hooks` names
        (tensorboard, wandb).
        """
        from speedtronic_trainer.integrations import (
            hooks_from_names,
        )  # integrations are optional; stay lazy

        names = list(getattr(section, "hooks", None) or [])
        built = list(hooks or []) + hooks_from_names(names, log_dir=hook_dir)
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

    def wants_step(self, step: int) -> bool:
        """Return True when a train_step record for `step` is due under every_steps."""
        return step % self.every_steps == 0

    def emit(self, event: str, payload: Metric) -> None:
        """Record one event as a text line, a JSONL record and a hook call."""
        with self._lock:
            self._emit_locked(event, payload)

    def _emit_locked(self, event: str, payload: Metric) -> None:
        line = f"{event} {_format_metrics(payload)}"
        self._write_text(logging.INFO, line, console=self.console_metrics or event != "train_step")
        if self._json is not None:
            self._json.write(
                json.dumps({"event": event, "time": time.time(), **payload}, default=str) + "\n"
            )
            self._json.flush()
        for hook in self.hooks:
            if id(hook) in self._failed_hooks:
                continue
            try:
                _deliver(hook, event, payload)
            except Exception as exc:  # a metrics sink must never end a training run
                self._failed_hooks.add(id(hook))
                self._write_text(
                    logging.WARNING,
                    f"hook {_hook_name(hook)} failed on {event!r} and is disabled: "
                    f"{type(exc).__name__}: {exc}",
                    console=True,
                )

    def _write_text(self, level: int, message: str, *, console: bool = True) -> None:
        if level < self._level:
            return
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {logging.getLevelName(level)} {message}\n"
        if console and self.stream is not None:
            self.stream.write(line)
            self.stream.flush()
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
                            logging.WARNING, f"hook {_hook_name(hook)} failed to close: {exc}"
                        )


def _format_metrics(metrics: Metric) -> str:
    parts = []
    for key, value in metrics.items():
        if isinstance(value, float):
            parts.append(f"{key}={value:.6g}")
        else:
            parts.append(f"{key}={value}")
    return " ".join(parts)


class CallbackList:
    """Fan-out adapter for optional W&B/TensorBoard-style callbacks."""

    def __init__(self, callbacks: list[Any] | None = None) -> None:
        self.callbacks = list(callbacks or [])

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        """Deliver the event to every callback in order."""
        for callback in self.callbacks:
            _deliver(callback, event, payload)

    def close(self) -> None:
        """Close every callback that can be closed."""
        for callback in self.callbacks:
            close = getattr(callback, "close", None)
            if callable(close):
                close()


__all__ = ["CallbackList", "Hook", "Metric", "MetricLogger", "TrainingHook", "memory_usage_bytes"]
