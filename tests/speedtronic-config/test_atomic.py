"""Atomic file writes (speedtronic_config.atomic): the old file or the whole new one, never torn."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from speedtronic_config import atomic
from speedtronic_config.atomic import (
    atomic_json_dump,
    atomic_write,
    atomic_write_bytes,
    atomic_write_text,
    current_umask,
    new_folders_removed_on_error,
    probe_folder,
    publish_private_file,
    remove_stale_temp_files,
)


@pytest.fixture(params=["unnamed", "named"])
def temp_kind(request, monkeypatch):
    """Run each test with Linux unnamed temp files and with the portable named-temp fallback."""
    if request.param == "named":
        monkeypatch.setattr(atomic, "_open_anonymous", lambda folder: None)
    elif atomic._open_anonymous is None or not hasattr(os, "O_TMPFILE"):
        pytest.skip("no O_TMPFILE on this platform")
    return request.param


def test_bytes_are_written_and_replaced(tmp_path, temp_kind):
    target = tmp_path / "nested" / "state.bin"
    assert atomic_write_bytes(target, b"one") == target
    atomic_write_bytes(str(target), b"two")
    assert target.read_bytes() == b"two"
    assert os.listdir(target.parent) == ["state.bin"]


def test_new_files_get_the_usual_permissions(tmp_path, temp_kind):
    # The named fallback used mkstemp, whose 0600 files a shared group could not read (#19).
    umask = os.umask(0o022)
    os.umask(umask)
    atomic_write_bytes(tmp_path / "f", b"x")
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o666 & ~umask


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o755], ids=oct)
def test_a_rewrite_keeps_the_files_permissions(tmp_path, temp_kind, mode):
    # Found: a 0600 file holding a secret came back 0644 after a rewrite.
    target = tmp_path / "secrets.yaml"
    target.write_bytes(b"old")
    target.chmod(mode)
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    assert target.stat().st_mode & 0o777 == mode


def test_a_rewrite_through_a_symlink_writes_its_target(tmp_path, temp_kind):
    # Found: the link was replaced by a regular file and the file it named kept the old text.
    shared = tmp_path / "shared"
    shared.mkdir()
    real = shared / "config.yaml"
    real.write_text("old")
    real.chmod(0o600)
    (tmp_path / "run").mkdir()
    hop = tmp_path / "run" / "hop.yaml"
    hop.symlink_to(real)  # absolute
    link = tmp_path / "run" / "config.yaml"
    link.symlink_to("hop.yaml")  # relative, through another link
    assert atomic_write_text(link, "new") == link
    assert link.is_symlink() and os.readlink(link) == "hop.yaml"
    assert hop.is_symlink() and real.read_text() == "new" and link.read_text() == "new"
    assert real.stat().st_mode & 0o777 == 0o600
    assert sorted(os.listdir(shared)) == ["config.yaml"]
    assert sorted(os.listdir(tmp_path / "run")) == ["config.yaml", "hop.yaml"]


def test_json_round_trips_and_bad_values_never_touch_the_disk(tmp_path, temp_kind):
    target = tmp_path / "latest.json"
    atomic_json_dump({"step": 3, "file": "ckpt-3.pt"}, target)
    assert json.loads(target.read_text()) == {"file": "ckpt-3.pt", "step": 3}
    with pytest.raises(TypeError, match="not JSON serializable"):
        atomic_json_dump({"step": object()}, target)
    assert json.loads(target.read_text())["step"] == 3
    assert os.listdir(tmp_path) == ["latest.json"]


def test_failure_during_the_rename_keeps_the_old_file(tmp_path, temp_kind, monkeypatch):
    target = tmp_path / "state.json"
    atomic_json_dump([1], target)

    def refuse(src, dst):
        raise PermissionError("read-only target")

    monkeypatch.setattr(atomic.os, "replace", refuse)
    with pytest.raises(PermissionError):
        atomic_json_dump([2], target)
    assert json.loads(target.read_text()) == [1]
    assert os.listdir(tmp_path) == ["state.json"]


def test_writer_errors_propagate_unchanged(tmp_path, temp_kind):
    def boom(handle):
        handle.write(b"partial")
        raise KeyboardInterrupt  # even a BaseException cleans up

    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "x", boom)
    assert os.listdir(tmp_path) == []


def test_stale_temp_files_of_our_naming_are_removed_and_nothing_else(tmp_path):
    stale = [tmp_path / ".step_4.pt.0a1b2c3d4e5f.tmp", tmp_path / ".step_8.pt.abcdef.tmp"]
    kept = [tmp_path / "step_4.pt", tmp_path / ".latest.x.tmp", tmp_path / "notes.tmp"]
    for path in stale + kept:
        path.write_bytes(b"x")
    assert remove_stale_temp_files(tmp_path, "step_*.pt") == sorted(stale)
    assert sorted(tmp_path.iterdir()) == sorted(kept)
    assert remove_stale_temp_files(tmp_path / "missing", "latest") == []


def test_probe_folder_creates_the_folder_and_leaves_nothing(tmp_path):
    assert probe_folder(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert list((tmp_path / "a" / "b").iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError):
        probe_folder(tmp_path / "file" / "sub")  # a path under a file
    with pytest.raises(OSError):
        probe_folder(tmp_path / "file")


def test_a_failed_body_removes_only_the_empty_folders_made_for_it(tmp_path):
    target = tmp_path / "a" / "b" / "c"
    with pytest.raises(KeyError), new_folders_removed_on_error(target) as folder:
        probe_folder(folder)
        raise KeyError("refused")
    assert list(tmp_path.iterdir()) == []  # a, b and c were made for it
    with pytest.raises(KeyError), new_folders_removed_on_error(target):
        probe_folder(target)
        (target.parent / "kept.txt").write_text("x")  # b is no longer empty: b and a stay
        raise KeyError("refused")
    assert not target.exists() and (target.parent / "kept.txt").exists()
    with new_folders_removed_on_error(target):  # success keeps what the body made
        probe_folder(target)
    assert target.is_dir()


def test_folder_fsync_tolerates_folders_that_cannot_be_synced(tmp_path, monkeypatch):
    real_fsync = os.fsync
    calls = []

    def picky_fsync(fd):
        calls.append(fd)
        if len(calls) > 1:  # the file syncs; the folder refuses
            raise OSError(22, "Invalid argument")
        real_fsync(fd)

    monkeypatch.setattr(atomic.os, "fsync", picky_fsync)
    atomic_write_bytes(tmp_path / "x", b"data")
    assert (tmp_path / "x").read_bytes() == b"data" and len(calls) == 2


KILLED_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from speedtronic_config import atomic
    if sys.argv[2] == "named":
        atomic._open_anonymous = lambda folder: None

    def slow(handle):
        handle.write(b"N" * 65536)
        handle.flush()
        Path(sys.argv[1] + ".started").with_name("started").write_text("1")
        time.sleep(60)  # killed here, mid-write

    atomic.atomic_write(sys.argv[1], slow)
""")


def test_a_killed_writer_keeps_the_old_file(tmp_path, temp_kind):
    work = tmp_path / "work"
    work.mkdir()
    target = work / "state.bin"
    atomic_write_bytes(target, b"previous")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(target), temp_kind])
    try:
        for _ in range(600):  # wait (event-driven, not timed) until the child is mid-write
            if (work / "started").exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the writer exited before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert target.read_bytes() == b"previous"
    leftovers = sorted(set(os.listdir(work)) - {"state.bin", "started"})
    if temp_kind == "unnamed":
        assert leftovers == []  # an unnamed file dies with its process
    else:
        # The portable fallback cannot clean up after SIGKILL: its temp is hidden, never read as
        # state, and removed by remove_stale_temp_files at the next start.
        assert (
            len(leftovers) == 1
            and leftovers[0].startswith(".state.bin.")
            and leftovers[0].endswith(".tmp")
        )


def test_a_private_file_is_published_with_the_usual_permissions(tmp_path):
    umask = os.umask(0o027)
    try:
        assert current_umask() == 0o027
        temp = tmp_path / ".w.tmp"
        temp.write_bytes(b"w")
        temp.chmod(0o600)  # as safetensors and mkstemp create files
        assert publish_private_file(temp, tmp_path / "w") == tmp_path / "w"
    finally:
        os.umask(umask)
    assert (tmp_path / "w").stat().st_mode & 0o777 == 0o640 and not temp.exists()


def test_text_is_written_as_utf8(tmp_path, temp_kind):
    assert atomic_write_text(tmp_path / "t.txt", "naïve\n") == tmp_path / "t.txt"
    assert (tmp_path / "t.txt").read_bytes() == "naïve\n".encode()


def test_staged_files_appear_together_or_not_at_all(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    for name, text in {"a.bin": "old a", "shard-2.bin": "old shard", "mine.txt": "kept"}.items():
        (folder / name).write_text(text)
    with pytest.raises(KeyboardInterrupt):
        with atomic.staged_files(folder, replaces=("shard-*.bin",)) as stage:
            (stage / "a.bin").write_text("new a")
            raise KeyboardInterrupt
    assert {p.name: p.read_text() for p in folder.iterdir()} == {
        "a.bin": "old a",
        "shard-2.bin": "old shard",
        "mine.txt": "kept",
    }
    with atomic.staged_files(folder, replaces=("shard-*.bin",)) as stage:
        assert stage.parent == folder and not any(stage.iterdir())
        (stage / "a.bin").write_text("new a")
        assert (folder / "a.bin").read_text() == "old a"  # nothing renamed in before the end
    assert {p.name: p.read_text() for p in folder.iterdir()} == {
        "a.bin": "new a",
        "mine.txt": "kept",
    }


def test_ctrl_c_while_staged_files_move_in_waits_for_the_whole_set(tmp_path, monkeypatch):
    # Ctrl-C between two renames left an export's new config.json beside its old weights.
    folder = tmp_path / "out"
    folder.mkdir()
    names = ("config.json", "model.safetensors", "tokenizer.json")
    for name in names:
        (folder / name).write_text("old")
    replace, moved = os.replace, []

    def pressed_after_the_first(source, target):
        replace(source, target)
        moved.append(target)
        if len(moved) == 1:
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(atomic.os, "replace", pressed_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        with atomic.staged_files(folder) as stage:
            for name in names:
                (stage / name).write_text("new")
    assert {p.name: p.read_text() for p in folder.iterdir()} == dict.fromkeys(names, "new")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
