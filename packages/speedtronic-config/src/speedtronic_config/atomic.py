"""Atomic file writes: a reader sees the old file or the complete new one, never a torn one.

The one implementation every package writes its files through (it needs the standard library
only, so it lives in the package all others depend on); speedtronic-systems adds torch.save.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

TEMP_SUFFIX = ".tmp"


def temp_glob(name: str) -> str:
    """Return the glob matching the temporary files written on the way to `name` (a file name, or
    a glob of file names such as `step_*.pt`).
    """
    return f".{name}.*{TEMP_SUFFIX}"


def remove_stale_temp_files(folder: str | os.PathLike[str], name: str) -> list[Path]:
    """Delete the temporary files an interrupted atomic write of `name` (a file name or a glob)
    left in `folder`; return them. Call it only where no write to those names is in flight.
    """
    removed = []
    for path in sorted(Path(folder).glob(temp_glob(name))):
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        removed.append(path)
    return removed


def probe_folder(folder: str | os.PathLike[str]) -> Path:
    """Create `folder` if needed and prove a file can be written, synced and removed in it; return
    it. Raises OSError (read-only, full, a file in the way, no permission) as the first real write
    would.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".speedtronic-probe.{os.urandom(6).hex()}{TEMP_SUFFIX}"
    try:
        with open(probe, "xb") as handle:
            handle.write(b"speedtronic write probe\n")
            handle.flush()
            os.fsync(handle.fileno())
    finally:
        probe.unlink(missing_ok=True)
    return folder


def unwritable_reason(folder: str | os.PathLike[str], error: OSError) -> str:
    """Return why probe_folder(folder) failed, for a one-line error: the file in the way when a
    part of the path is one (mkdir says only `File exists` or `Not a directory`), else the
    system's reason.
    """
    for part in (Path(folder), *Path(folder).parents):
        if part.exists() and not part.is_dir():
            return f"{part} is a file, not a folder"
    return error.strerror or str(error)


def missing_folders(*folders: str | os.PathLike[str]) -> list[Path]:
    """Return the folders and parents of `folders` that do not exist yet, deepest first."""
    missing = {
        path
        for folder in folders
        for path in (Path(folder), *Path(folder).parents)
        if not path.exists()
    }
    return sorted(missing, key=lambda path: len(path.parts), reverse=True)


def remove_empty_folders(folders: list[Path]) -> None:
    """Remove each folder that is empty, in order (deepest first: a parent after its children)."""
    for path in folders:
        with contextlib.suppress(OSError):  # not empty (or not there): kept
            path.rmdir()


@contextlib.contextmanager
def new_folders_removed_on_error(folder: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield `folder`; when the body raises, remove it and the parents missing on entry while they
    are still empty, so a command refused after creating its output folder leaves nothing behind.
    """
    missing = missing_folders(folder)
    try:
        yield Path(folder)
    except BaseException:
        remove_empty_folders(missing)
        raise


STAGING = "staging"  # the name a staged set's hidden folder is made from (temp_glob matches it)


@contextlib.contextmanager
def staged_files(
    folder: str | os.PathLike[str], *, replaces: tuple[str, ...] = ()
) -> Iterator[Path]:
    """Yield an empty hidden folder inside `folder` to write a set of files into. When the body
    returns, rename each into `folder` (replacing files of the same name), then delete the files
    matching a `replaces` glob that the set lacks; when it raises, delete the set. A failure while
    writing (disk full, Ctrl-C) thus leaves `folder`'s earlier files whole.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(temp_glob(STAGING)):  # left by a process killed while staging
        shutil.rmtree(stale, ignore_errors=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{STAGING}.", suffix=TEMP_SUFFIX, dir=folder))
    try:
        yield stage
        names = sorted(path.name for path in stage.iterdir())
        with interrupts_held():  # Ctrl-C between two renames would leave a mixed set
            for name in names:
                os.replace(stage / name, folder / name)
            for pattern in replaces:
                for path in folder.glob(pattern):
                    if path.name not in names:
                        path.unlink(missing_ok=True)
        fsync_folder(folder)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Within the block, Ctrl-C (SIGINT) waits: it is raised as KeyboardInterrupt once the block
    is done. Only in the main thread under Python's default handler; an ignored SIGINT or a
    host's own handler is left as it is.
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    pressed = False

    def hold(signum: int, frame: Any) -> None:
        nonlocal pressed
        pressed = True

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if pressed:
        raise KeyboardInterrupt


def current_umask() -> int:
    """Return the process umask (read from /proc where it can be, as setting it is not
    thread-safe).
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def publish_private_file(temp: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """Give a finished temp file a library created 0600 (safetensors, mkstemp) the permissions
    open() would have, then rename it to `path` atomically; return the path.
    """
    os.chmod(temp, 0o666 & ~current_umask())
    os.replace(temp, path)
    return Path(path)


def _open_anonymous(folder: Path) -> int | None:
    """Return a descriptor of an unnamed file in `folder` (Linux O_TMPFILE), or None where
    unsupported.

    An unnamed file vanishes with its process, so a SIGKILL while writing leaves nothing behind;
    only a kill between naming it (_link_anonymous) and the rename leaves a temp file, which
    remove_stale_temp_files clears.
    """
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        return os.open(
            folder, flag | os.O_WRONLY, 0o666
        )  # the kernel applies the umask, as for open()
    except OSError:  # the filesystem does not support unnamed files (e.g. some network mounts)
        return None


def fsync_folder(folder: Path) -> None:
    """Persist the folder entry that os.replace changed (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on a folder; the data itself is already synced
        pass
    finally:
        os.close(fd)


def _link_anonymous(fd: int, path: Path) -> str:
    """Give the unnamed file behind `fd` a fresh hidden name beside `path`; return that name."""
    # linkat cannot replace an existing name, so link under a fresh name and rename that. A folder
    # descriptor makes Python call linkat(AT_SYMLINK_FOLLOW), which resolves the /proc link to the
    # file.
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        while True:
            name = f".{path.name}.{os.urandom(6).hex()}{TEMP_SUFFIX}"
            try:
                os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=folder, follow_symlinks=True)
                return str(path.parent / name)
            except FileExistsError:
                continue
    finally:
        os.close(folder)


def _publish(fd: int, temp_name: str | None, path: Path) -> None:
    """Give the written file its final name with one atomic rename (`temp_name` None: unnamed
    file).
    """
    if temp_name is None:
        temp_name = _link_anonymous(fd, path)
    try:
        os.replace(temp_name, path)
    except BaseException:
        _unlink_quietly(temp_name)
        raise


def _unlink_quietly(name: str) -> None:
    try:
        os.unlink(name)
    except FileNotFoundError:
        pass


def _open_named(path: Path) -> tuple[int, str]:
    """Return a descriptor and the name of a fresh hidden temp file beside `path`."""
    while True:
        name = str(path.parent / f".{path.name}.{os.urandom(6).hex()}{TEMP_SUFFIX}")
        try:
            # 0o666 through the umask, like open(): mkstemp's 0600 would hide the file from the
            # group an output folder is shared with.
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), name
        except FileExistsError:
            continue


def _os_error(error: BaseException) -> OSError | None:
    """Return the OSError behind `error`: torch.save reports a failed write (ENOSPC, EIO) as
    `RuntimeError: [enforce fail at inline_container.cc]`, with the OSError as its context.
    """
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], Any]) -> Path:
    """Write `path` through `write(file)` atomically and durably; on any failure the old file
    stays. A file that exists keeps its permission bits, and a symlink keeps pointing at the file
    it names, which is the one rewritten. A failed write raises the OSError behind it (errno
    ENOSPC for a full disk).
    """
    given = Path(path)
    # The rename replaces a name, so rename onto the file the link names, not the link itself.
    path = Path(os.path.realpath(given)) if given.is_symlink() else given
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # Read, write and execute bits only: like a write in place, a rewrite never carries
        # setuid/setgid over.
        mode: int | None = os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        mode = None  # a new file: open()'s 0o666 through the umask
    fd, temp_name = _open_anonymous(path.parent), None
    if fd is None:
        fd, temp_name = _open_named(path)
    try:
        if mode is not None and hasattr(os, "fchmod"):  # Windows before 3.13 has no fchmod
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb", closefd=False) as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        _publish(fd, temp_name, path)
    except Exception as error:
        if temp_name is not None:
            _unlink_quietly(temp_name)
        cause = _os_error(error)
        if cause is None or cause is error:
            raise
        raise cause from error
    except BaseException:
        if temp_name is not None:
            _unlink_quietly(temp_name)
        raise
    finally:
        os.close(fd)
    fsync_folder(path.parent)
    return given


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write `data` to `path` atomically; return the path."""
    return atomic_write(path, lambda handle: handle.write(data))


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically; return the path."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_json_dump(
    value: Any, path: str | os.PathLike[str], *, indent: int | None = 2, sort_keys: bool = True
) -> Path:
    """Write `value` as JSON to `path` atomically; return the path. Serializes before touching the
    disk.
    """
    text = json.dumps(value, indent=indent, sort_keys=sort_keys)
    return atomic_write_bytes(path, (text + "\n").encode("utf-8"))


__all__ = [
    "STAGING",
    "TEMP_SUFFIX",
    "atomic_json_dump",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_text",
    "current_umask",
    "fsync_folder",
    "interrupts_held",
    "missing_folders",
    "new_folders_removed_on_error",
    "probe_folder",
    "publish_private_file",
    "remove_empty_folders",
    "remove_stale_temp_files",
    "staged_files",
    "temp_glob",
    "unwritable_reason",
]
