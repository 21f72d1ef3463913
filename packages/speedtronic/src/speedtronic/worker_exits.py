"""What each torchrun worker exited for, as the launcher reads it.

torchrun reports only how each worker process ended. A worker that had already decided its exit
code can still end otherwise: torchrun terminates it (-15) when a peer's exit is seen first, or
its gloo teardown aborts (-6). A rank that stopped because a peer failed exits 1 like a real
failure. So each worker writes what it exits for into a folder the launcher names, and the
launcher judges the group by the ranks that failed on their own.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

RECORDS_ENV = "SPEEDTRONIC_EXIT_RECORDS"  # the folder, set by the launcher for its workers
PEER = "peer"  # this rank stopped because another rank failed


def record_exit(outcome: int | str) -> None:
    """Note this worker's exit code (or PEER) for the launcher, if it asked; the first note of a
    process is the one kept.
    """
    folder = os.environ.get(RECORDS_ENV)
    if not folder:
        return
    with contextlib.suppress(OSError), Path(folder, os.environ.get("RANK", "0")).open("x") as f:
        f.write(str(outcome))


def read_records(folder: str | os.PathLike[str]) -> dict[int, str]:
    """Return {rank: outcome} of the notes in `folder`."""
    records = {}
    for path in Path(folder).iterdir():
        with contextlib.suppress(OSError, ValueError):
            records[int(path.name)] = path.read_text()
    return records


def root_causes(exits: dict[int, int], records: dict[int, str]) -> set[int]:
    """Return the exit codes of the failed ranks (`exits`: rank -> torchrun's exit code) that
    failed on their own: a rank that noted PEER is left out, one that noted a code counts as that
    code (however its process ended after), and one torchrun terminated without a note stays -15.
    """
    causes = set()
    for rank, code in exits.items():
        said = records.get(rank)
        if said == PEER:
            continue
        with contextlib.suppress(TypeError, ValueError):
            code = int(said)  # type: ignore[arg-type]
        if code != 0:
            causes.add(code)
    return causes


__all__ = ["PEER", "RECORDS_ENV", "read_records", "record_exit", "root_causes"]
