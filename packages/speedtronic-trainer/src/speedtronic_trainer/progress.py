"""A tqdm progress bar shown only in an interactive terminal."""

from __future__ import annotations

import sys
from typing import TextIO


def progress_enabled(setting: bool | None, stream: TextIO | None = None) -> bool:
    """Return whether to draw a bar for `logging.progress` (speedtronic-config reads `auto` as
    None): None or True only when the stream is a terminal, False never.
    """
    if setting is False:
        return False
    return is_terminal(sys.stderr if stream is None else stream)


def is_terminal(stream: TextIO | None) -> bool:
    """Return True when `stream` is an interactive terminal (not a file, pipe or None)."""
    isatty = getattr(stream, "isatty", None)
    return bool(callable(isatty) and isatty())


class ProgressBar:
    """Show step, loss, tokens/s and ETA; a no-op when disabled."""

    def __init__(
        self, *, total: int, initial: int, enabled: bool, stream: TextIO | None = None
    ) -> None:
        self._bar = None
        if enabled:
            from tqdm import tqdm  # only paid for in an interactive terminal

            self._bar = tqdm(
                total=total,
                initial=initial,
                unit="step",
                dynamic_ncols=True,
                file=sys.stderr if stream is None else stream,
            )

    @property
    def active(self) -> bool:
        """Return True while a bar is drawn."""
        return self._bar is not None

    def update(self, step: int, loss: float | None, tokens_per_s: float) -> None:
        """Advance to `step` and show the latest loss and throughput."""
        if self._bar is None:
            return
        self._bar.update(step - self._bar.n)
        self._bar.set_postfix(
            loss=f"{loss:.4f}" if loss is not None else "-",
            tok_s=f"{tokens_per_s:,.0f}",
            refresh=False,
        )

    def close(self) -> None:
        """Remove the bar."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def write_beside_bars(stream: TextIO, text: str) -> None:
    """Write `text` to `stream` and flush; while a progress bar is drawn (tqdm loaded), lift it
    first and redraw it after, so a log line starts on a line of its own, not inside the bar.
    """
    tqdm = sys.modules.get("tqdm")  # imported only once a bar was drawn, or by another library
    if tqdm is None:
        stream.write(text)
        stream.flush()
        return
    with tqdm.tqdm.external_write_mode(file=stream):
        stream.write(text)
        stream.flush()


__all__ = ["ProgressBar", "is_terminal", "progress_enabled", "write_beside_bars"]
