"""What each torchrun worker exited for, as the launcher reads it.

torchrun reports only how each worker process ended. A worker that had already decided its exit
code can still end otherwise: torchrun terminates it (-15) when a peer's exit is seen first, or
its gloo teardown aborts (-6). A rank that stopped because a peer failed exits 1 like a real
failure. So each worker writes what it exits for into a folder the launcher names, and the
launcher judges the group by the ranks that failed on their own.

A note is named by the worker's rank and pid: torchrun restarts the group (--max-restarts, or a
node joining) into the same folder, and a failed worker is matched to its own process's note,
never to an earlier round's.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from speedtronic.errors import signal_exit_code

RECORDS_ENV = "SPEEDTRONIC_EXIT_RECORDS"  # the folder, set by the launcher for its workers
PEER = "peer"  # this rank stopped because another rank failed
TERMINATED = -signal.SIGTERM  # torchrun's code for a worker a SIGTERM ended before it noted one
# What a worker stopped by SIGTERM / SIGINT in its training loop (after its checkpoint) exits with.
SIGTERM_STOP, SIGINT_STOP = signal_exit_code("SIGTERM"), signal_exit_code("SIGINT")
SIGNAL_STOPS = (SIGTERM_STOP, SIGINT_STOP)


def record_exit(outcome: int | str) -> None:
    """Note this worker's exit code (or PEER) for the launcher, if it asked; the first note of a
    process is the one kept.
    """
    folder = os.environ.get(RECORDS_ENV)
    if not folder:
        return
    name = f"{os.environ.get('RANK', '0')}.{os.getpid()}"
    with contextlib.suppress(OSError), Path(folder, name).open("x") as f:
        f.write(str(outcome))


def forget_earlier_exit() -> None:
    """Remove this rank's notes, which only earlier processes of the rank can have written (in an
    earlier restart round): were the launcher signalled before this process notes anything, such
    a note would say a stop this round did not make.
    """
    folder = os.environ.get(RECORDS_ENV)
    if folder:
        for path in Path(folder).glob(f"{os.environ.get('RANK', '0')}.*"):
            with contextlib.suppress(OSError):
                path.unlink()


def read_records(folder: str | os.PathLike[str]) -> dict[tuple[int, int], str]:
    """Return {(rank, pid): outcome} of the notes in `folder`."""
    records = {}
    for path in Path(folder).iterdir():
        with contextlib.suppress(OSError, ValueError):
            rank, pid = path.name.split(".")
            records[int(rank), int(pid)] = path.read_text()
    return records


def rank_outcomes(
    exits: dict[int, tuple[int, int]], records: dict[tuple[int, int], str]
) -> dict[int, int | str]:
    """Return what each failed rank (`exits`: rank -> torchrun's exit code and the worker's pid)
    exited for: its process's note (a code, or PEER), however the process ended after; torchrun's
    code where it noted nothing.
    """
    said: dict[int, int | str] = {}
    for rank, (code, pid) in exits.items():
        note = records.get((rank, pid))
        try:
            said[rank] = PEER if note == PEER else int(note)  # type: ignore[arg-type]
        except (TypeError, ValueError):  # no note (or a torn one)
            said[rank] = code
    return said


def root_causes(outcomes: dict[int, int | str]) -> dict[int, int]:
    """Return {rank: code} of the ranks that failed on their own, of `outcomes`: not those that
    finished (0), stopped for a peer (PEER), or died of SIGTERM before noting anything (torchrun
    terminates the rest when one exits).
    """
    return {
        rank: code
        for rank, code in outcomes.items()
        if isinstance(code, int) and code not in (0, TERMINATED)
    }


def preempted_exit_code(outcomes: dict[int, int | str]) -> int | None:
    """Return the group's exit code when a signal stopped it (of `outcomes`), else None: every
    rank that did not stop for a peer noted a signal stop (143/130) or died of SIGTERM before
    noting anything (a worker outside its training loop, or torchrun's SIGTERM to the rest). The
    code is the one the ranks noted; none noted: SIGTERM's.
    """
    codes = {code for code in outcomes.values() if code not in (PEER, 0)}
    if not codes or not codes <= {*SIGNAL_STOPS, TERMINATED}:
        return None
    return SIGINT_STOP if codes - {TERMINATED} == {SIGINT_STOP} else SIGTERM_STOP


def stop_said(records: dict[tuple[int, int], str]) -> bool:
    """Return whether a worker noted a signal stop (143/130), which rank 0 then said: in its
    training loop, where it checkpoints, or Ctrl-C outside it ("interrupted"). A worker that
    SIGTERM ended anywhere else (starting up, or after its loop) noted nothing and said nothing.
    """
    return not {str(code) for code in SIGNAL_STOPS}.isdisjoint(records.values())


__all__ = [
    "PEER",
    "RECORDS_ENV",
    "TERMINATED",
    "forget_earlier_exit",
    "preempted_exit_code",
    "rank_outcomes",
    "read_records",
    "record_exit",
    "root_causes",
    "stop_said",
]
