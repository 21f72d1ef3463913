"""Run the speedtronic CLI in this process with one fault injected where real ones strike.

Usage: python tools/reliability/inject.py FAULT -- COMMAND ARGS...

FAULT is one of
  kill-at-rename:GLOB:N         SIGKILL at the Nth rename onto a file matching GLOB (the temp file
                                is complete and named: the window a crash leaves a temp behind)
  kill-mid-write:GLOB:N:BYTES   SIGKILL after BYTES bytes of the Nth atomic write of GLOB
  enospc:GLOB:N:BYTES           the Nth write of GLOB fails with ENOSPC after BYTES bytes (atomic
                                writes, and the metrics/log files the logger appends to)
  erofs:GLOB:N                  the Nth write of GLOB fails with EROFS when it starts
GLOB matches the file name (e.g. step_*.pt, latest, metrics.jsonl, loss_curve.png, .speedtronic-
probe.*). Nothing here changes the library: the hooks wrap the functions it calls.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import signal
import sys
from pathlib import Path
from typing import Any


class Fault:
    """Which writes to hit and what happens to the one that is hit."""

    def __init__(self, spec: str) -> None:
        kind, glob, nth, *rest = spec.split(":")
        self.kind, self.glob, self.nth = kind, glob, int(nth)
        self.budget = int(rest[0]) if rest else 0
        self.seen = 0

    def hits(self, path: str | os.PathLike[str]) -> bool:
        """Count a write to `path`; return True when it is the one to fail."""
        if not fnmatch.fnmatch(Path(path).name, self.glob):
            return False
        self.seen += 1
        return self.seen == self.nth

    def strike(self) -> None:
        """Do what the fault does once its byte budget is spent."""
        if self.kind.startswith("kill"):
            os.kill(os.getpid(), signal.SIGKILL)
        code = errno.ENOSPC if self.kind == "enospc" else errno.EROFS
        raise OSError(code, os.strerror(code))


class FaultyFile:
    """A file whose writes go through until the fault's budget is spent, then strike."""

    def __init__(self, handle: Any, fault: Fault) -> None:
        self._handle, self._fault, self._left = handle, fault, fault.budget

    def write(self, data: Any) -> int:
        if len(data) > self._left:
            self._handle.write(data[: self._left])  # the partial write a full disk leaves
            self._handle.flush()
            self._left = 0
            self._fault.strike()
        self._left -= len(data)
        return self._handle.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


def install(fault: Fault) -> None:
    """Wrap the writers speedtronic uses so the fault strikes where a real one would."""
    from speedtronic_config import atomic
    from speedtronic_trainer import metric_logger

    if fault.kind == "kill-at-rename":
        real_replace = os.replace

        def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            if fault.hits(dst):
                fault.strike()
            real_replace(src, dst, *args, **kwargs)

        os.replace = replace
        return

    real_write = atomic.atomic_write

    def atomic_write(path: Any, write: Any) -> Path:
        if fault.hits(path):
            if fault.kind == "erofs":
                fault.strike()
            return real_write(path, lambda handle: write(FaultyFile(handle, fault)))
        return real_write(path, write)

    atomic.atomic_write = atomic_write
    real_open = metric_logger.MetricLogger._open

    def open_log(name: str | None) -> Any:
        handle = real_open(name)
        if handle is not None and fault.hits(name):
            if fault.kind == "erofs":
                fault.strike()
            return FaultyFile(handle, fault)
        return handle

    metric_logger.MetricLogger._open = staticmethod(open_log)
    real_probe = atomic.probe_folder

    def probe_folder(folder: Any) -> Path:
        if fault.hits(Path(folder) / ".speedtronic-probe.tmp"):
            fault.strike()
        return real_probe(folder)

    atomic.probe_folder = probe_folder
    from speedtronic import preflight

    preflight.probe_folder = probe_folder
    if not fault.glob.endswith((".png", ".pdf", ".svg")):
        return  # matplotlib costs half a second to import
    from matplotlib.figure import Figure

    real_savefig = Figure.savefig

    def savefig(self: Any, target: Any, *args: Any, **kwargs: Any) -> None:
        if fault.hits(target):
            fault.strike()
        real_savefig(self, target, *args, **kwargs)

    Figure.savefig = savefig


def main(argv: list[str]) -> int:
    """Install the fault named in argv[0], then run the CLI with the arguments after `--`."""
    if len(argv) < 2 or argv[1] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    install(Fault(argv[0]))
    from speedtronic.cli import main as cli_main

    return cli_main(argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
