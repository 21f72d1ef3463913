"""A worker of `speedtronic train --nproc-per-node` stops itself when its launcher is gone.

torchrun stops the workers it knows of when the launcher is signalled, but a signal that lands
while it is still starting them leaves those already started out of its shutdown, and one that
kills the launcher outright (SIGKILL, the OOM killer) stops none. Such a worker would wait on the
dead launcher's rendezvous store until its timeout, or train on with no one to report to, holding
a GPU's memory either way. A worker no longer run by its launcher sends itself SIGTERM: one
starting up ends, one in its training loop checkpoints and stops, as when torchrun passes a
signal on. Run by it means: the worker's parent is still the one it started under, and that
parent is the launcher or, where PYTHON_EXEC is a wrapper that runs python without `exec`, a
process the launcher started. A worker whose wrapper was killed (torchrun takes that for the
worker's end) stops too.
"""

from __future__ import annotations

import os
import signal
import threading
import time

LAUNCHER_ENV = "SPEEDTRONIC_LAUNCHER_PID"  # the launcher's pid, set by it for its workers
# How often a worker looks: a second's delay is nothing beside a rendezvous timeout, and the
# look (getppid, and a /proc read per wrapper) costs nothing. The kernel sends no event when a
# parent dies that a child can wait on portably (torchrun closes inherited pipes; prctl is
# Linux-only and sees the parent alone, the wrapper where there is one), hence polling.
POLL_S = 0.5


def watch_launcher() -> None:
    """Send this process SIGTERM once the launcher named in LAUNCHER_ENV no longer runs it (see
    the module docstring), looking at once, then every POLL_S from a daemon thread; nothing when
    no launcher set it. The variable is taken out of the environment: a process this one starts
    has another parent.
    """
    named = os.environ.pop(LAUNCHER_ENV, None)
    if not named:
        return
    launcher, parent = int(named), os.getppid()  # parent: the launcher, or a wrapper it started
    if not _descends_from(parent, launcher):  # gone before this process looked: start no work
        os.kill(os.getpid(), signal.SIGTERM)
        return
    threading.Thread(
        target=_stop_when_orphaned, args=(launcher, parent), name="launcher-watch", daemon=True
    ).start()


def _stop_when_orphaned(launcher: int, parent: int) -> None:
    while os.getppid() == parent and _descends_from(parent, launcher):
        time.sleep(POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)


def _descends_from(pid: int, launcher: int) -> bool:
    """Return whether process `pid` is `launcher` or a descendant of it. Linux's /proc tells
    exactly: a process that ends hands its children to another parent, and one that reuses its
    pid is no ancestor. Without /proc (macOS) a wrapper counts while a process `launcher` exists.
    """
    if pid == launcher:
        return True
    if not os.path.isdir("/proc/self"):
        try:
            os.kill(launcher, 0)  # another user's process there is no launcher of this one either
        except OSError:
            return False
        return True
    while pid != launcher:
        try:
            with open(f"/proc/{pid}/stat") as stat:  # "pid (name) state ppid ..."
                pid = int(stat.read().rsplit(")", 1)[1].split()[1])
        # Past pid 1 (its parent is 0), ended, or hidden (/proc mounted hidepid, another user's
        # wrapper): a launcher this worker cannot find is taken for gone, as before wrappers.
        except OSError:
            return False
    return True


__all__ = ["LAUNCHER_ENV", "watch_launcher"]
