"""One live run per run folder: two runs writing one output folder overwrite each other's
checkpoints and `latest`, and interleave their metrics, each exiting 0.

The lock is an advisory `flock` on a file in the folder, so the kernel drops it when the process
dies (a SIGKILL leaves nothing to clean up); a process that builds several runs on one folder
(a notebook, a resume in the same script) holds it once for as long as any of them is alive,
or until `speedtronic.runtime.end_run` ends them (`speedtronic train` and `train_from_config` do).
Where no lock can be taken (no fcntl on Windows, a filesystem that keeps no locks) the run trains
unguarded, as 2.0 did.
"""

from __future__ import annotations

import os
import socket
import weakref
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from speedtronic_config import SpeedtronicConfig
from speedtronic_config.errors import on_every_rank

try:
    import fcntl
except ImportError:  # Windows: no flock, no lock (the run still trains)
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".speedtronic-run.lock"
# Folder -> (open lock file, how many live runs of this process hold it).
_held: dict[Path, list[Any]] = {}


class RunFolderBusy(RuntimeError):
    """Another live run writes the folder this run would write."""


def run_folders(config: SpeedtronicConfig) -> list[Path]:
    """Return the folders one run owns: run.output_dir, and the checkpoint folder when it lies
    outside it.
    """
    output = Path(config.run.output_dir).resolve()
    folders = [output]
    if config.checkpoint.enabled:
        checkpoints = (output / config.checkpoint.directory).resolve()
        if not checkpoints.is_relative_to(output):
            folders.append(checkpoints)
    return folders


class RunLock:
    """The locks one run holds; released by release(), or when the object it is tied to dies."""

    def __init__(self, folders: list[Path]) -> None:
        self.folders: list[Path] = []
        self.warnings: list[str] = []  # one per folder its filesystem could not lock
        try:
            for folder in folders:
                if folder not in _held:
                    handle = _lock(folder)
                    if handle is None:
                        self.warnings.append(_unlocked_warning(folder))
                        continue
                    _held[folder] = [handle, 0]
                _held[folder][1] += 1
                self.folders.append(folder)
        except BaseException:
            self.release()  # the folders locked before the busy one
            raise

    def tie_to(self, owner: object) -> weakref.finalize:
        """Hold the locks for as long as `owner` (the run's trainer) lives; return the finalizer,
        which releases them sooner when called.
        """
        return weakref.finalize(owner, self.release)

    def release(self) -> None:
        """Drop this run's hold on its folders (idempotent); the last holder unlocks them."""
        folders, self.folders = self.folders, []
        for folder in folders:
            entry = _held[folder]
            entry[1] -= 1
            if entry[1] == 0:
                del _held[folder]
                entry[0].close()  # closing the file drops the flock


def claim_run_folders(config: SpeedtronicConfig, parallel: Any) -> RunLock:
    """Lock the run's folders on the main rank; every rank raises RunFolderBusy, naming the other
    run's process, when another process holds one, and the main rank's OSError when it cannot
    open a lock file (one it may not write, a folder of that name) or its RuntimeError when it
    cannot resolve a folder (a symlink loop).
    """
    lock, refusal = RunLock([]), None
    if parallel.is_main and fcntl is not None:
        try:
            lock = RunLock(run_folders(config))
        # RuntimeError: RunFolderBusy, and Path.resolve's symlink loop (OSError from Python 3.13).
        except (RuntimeError, OSError) as error:
            refusal = error
    refusal = parallel.broadcast_object(refusal)  # one decision for the whole group
    if refusal is not None:
        raise on_every_rank(refusal)
    return lock


def _lock(folder: Path) -> TextIO | None:
    """Return the open, locked lock file of `folder`, or None where its filesystem keeps no
    locks; raise RunFolderBusy, naming the holder, where another process holds it.
    """
    folder.mkdir(parents=True, exist_ok=True)
    handle = open(folder / LOCK_NAME, "a+", encoding="utf-8")  # noqa: SIM115 (held open)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise RunFolderBusy(
            f"{folder} is in use by another run ({holder}); stop it or wait for it to end, or give "
            "this run its own run.output_dir (or checkpoint.directory)"
        ) from None
    except OSError:
        # Lustre mounted without `flock`, some network mounts: 2.0 trained there, and so does
        # this run, unguarded (RunLock.warnings says so).
        handle.close()
        return None
    handle.seek(0)
    handle.truncate()
    # With its UTC offset: the run refused may be on a host in another time zone.
    started = datetime.now().astimezone().isoformat(sep=" ", timespec="seconds")
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since {started}\n")
    handle.flush()
    return handle


def _unlocked_warning(folder: Path) -> str:
    return (
        f"{folder} is on a filesystem that keeps no file locks (flock failed), so a second run "
        "started in it now would not be refused: start one run per run.output_dir (on Lustre, "
        "mount with -o flock to have it refused)"
    )


def remove_unheld_lock(folder: Path) -> None:
    """Delete the folder's lock file unless a live run holds it (then it is that run's)."""
    path = folder / LOCK_NAME
    try:
        handle = open(path, encoding="utf-8")  # noqa: SIM115 (closed below); never creates it
    except OSError:
        return
    with handle:
        if fcntl is not None:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return
            except OSError:  # a filesystem without locks, where no run can hold one
                pass
        path.unlink(missing_ok=True)


__all__ = [
    "LOCK_NAME",
    "RunFolderBusy",
    "RunLock",
    "claim_run_folders",
    "remove_unheld_lock",
    "run_folders",
]
