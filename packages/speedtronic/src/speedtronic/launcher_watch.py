"""A worker of `speedtronic train --nproc-per-node` stops itself when its launcher is gone.

torchrun stops the workers it knows of when the launcher is signalled, but a signal that lands
while it is still starting them leaves those already started out of its shutdown, and one that
kills the launcher outright (SIGKILL, the OOM killer) stops none. Such a worker would wait on the
dead launcher's rendezvous store until its timeout, or train on with no one to report to, holding
a GPU's memory either way. A worker whose parent is no longer its launcher sends itself SIGTERM:
one starting up ends, one in its training loop checkpoints and stops, as when torchrun passes a
signal on.
"""

from __future__ import annotations

import os
import signal
import threading
import time

LAUNCHER_ENV = "SPEEDTRONIC_LAUNCHER_PID"  # the launcher's pid, set by it for its workers
# How often a worker looks: a second's delay is nothing beside a rendezvous timeout, and the
# look (one getppid) costs nothing. The kernel sends no event when a parent dies that a child
# can wait on portably (torchrun closes inherited pipes; prctl is Linux-only), hence polling.
POLL_S = 0.5


def watch_launcher() -> None:
    """Start a daemon thread that sends this process SIGTERM once its parent is not the launcher
    named in LAUNCHER_ENV (a launcher that died before this process looked counts as gone);
    nothing when no launcher set it. The variable is taken out of the environment: a process
    this one starts has another parent.
    """
    launcher = os.environ.pop(LAUNCHER_ENV, None)
    if not launcher:
        return
    threading.Thread(
        target=_stop_when_orphaned, args=(int(launcher),), name="launcher-watch", daemon=True
    ).start()


def _stop_when_orphaned(launcher: int) -> None:
    while os.getppid() == launcher:
        time.sleep(POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)


__all__ = ["LAUNCHER_ENV", "watch_launcher"]
