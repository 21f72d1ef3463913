"""The worker processes of a torchrun launcher and their ends, read from Linux's /proc."""

from __future__ import annotations

from pathlib import Path

# A process that exited is gone from /proc (FileNotFoundError); one that is exiting answers ESRCH
# (ProcessLookupError): both mean it no longer runs.
_ENDED = (FileNotFoundError, ProcessLookupError)


def torchrun_workers(launcher: int) -> dict[int, int]:
    """Return {rank: pid} of the worker processes a torchrun launcher (or agent) runs now; none
    for a process that started no workers or has ended.
    """
    try:
        children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    except _ENDED:
        return {}
    found = {}
    for pid in map(int, children):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except _ENDED:
            continue
        rank = next((e.split(b"=")[1] for e in environ if e.startswith(b"RANK=")), None)
        if rank is not None:
            found[int(rank)] = pid
    return found


def process_ended(pid: int) -> bool:
    """Return whether process pid has exited (a zombie its parent has not reaped yet counts)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except _ENDED:
        return True
