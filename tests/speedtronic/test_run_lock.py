"""One live run per run folder: a second process is refused; the same process may build again."""

from __future__ import annotations

import datetime
import errno
import fcntl
import gc
import hashlib
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_launch import latest_step, wait_for
from test_runtime import small_config as config

import speedtronic.runtime as runtime
from speedtronic.run_lock import LOCK_NAME, RunFolderBusy, run_folders
from speedtronic_config import SpeedtronicConfig

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX")
ROOT = Path(__file__).resolve().parents[2]


def hold_lock(folder) -> subprocess.Popen:
    """Start a process that holds a RunLock on `folder` until its stdin closes; return it once
    the lock is held (it prints its pid then: an event, not a sleep).
    """
    code = textwrap.dedent(
        f"""
        import os, sys
        from pathlib import Path
        from speedtronic.run_lock import RunLock
        lock = RunLock([Path({str(folder)!r})])
        print(os.getpid(), flush=True)
        sys.stdin.read()
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    process.pid_line = process.stdout.readline()
    return process


def end(process: subprocess.Popen) -> None:
    process.stdin.close()
    assert process.wait(timeout=60) == 0


@pytest.fixture
def other_run():
    """hold_lock, ended when the test ends."""
    holders = []
    yield lambda folder: holders.append(hold_lock(folder)) or holders[-1]
    for process in holders:
        if not process.stdin.closed:
            end(process)


def test_a_folder_another_process_runs_in_is_refused_until_that_run_ends(tmp_path, other_run):
    holder = other_run(tmp_path.resolve())
    busy = rf"{tmp_path.name} is in use by another run \(pid {int(holder.pid_line)} on "
    with pytest.raises(RunFolderBusy, match=busy):
        runtime.build_runtime(config(tmp_path))
    end(holder)
    runtime.build_runtime(config(tmp_path))


def test_the_lock_names_its_start_with_the_utc_offset(tmp_path, other_run):
    # Hosts in other time zones read it: a bare local time misled them by hours.
    holder = other_run(tmp_path.resolve())
    held = (tmp_path / LOCK_NAME).read_text()
    started = re.fullmatch(rf"pid {holder.pid} on .+, since (.+)\n", held).group(1)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[+-]\d\d:\d\d", started), started
    when = datetime.datetime.fromisoformat(started)
    assert abs(datetime.datetime.now(datetime.timezone.utc) - when) < datetime.timedelta(hours=1)


def test_the_same_process_may_build_twice_and_the_lock_ends_with_its_runs(
    tmp_path, other_run, capsys
):
    from speedtronic.cli import main

    first, _ = runtime.build_runtime(config(tmp_path))
    second, _ = runtime.build_runtime(config(tmp_path))  # a notebook re-running a cell
    # Another process cannot take it while either run lives, and can once both are gone.
    refused = hold_lock(tmp_path.resolve())
    assert refused.pid_line == "" and refused.wait(timeout=60) == 1
    assert "RunFolderBusy" in refused.stderr.read()
    del first, second
    gc.collect()
    holder = other_run(tmp_path.resolve())
    assert int(holder.pid_line) == holder.pid
    # The CLI says it in one line and exit 2, as for any setting to fix.
    argv = ["train", "max_steps: 1\ndevice: cpu", "--set", f"run.output_dir={tmp_path}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("speedtronic train: ") and "is in use by another run" in err
    assert err.count("\n") == 1


def test_a_finished_run_frees_its_folder_though_its_trainer_lives_on(tmp_path, other_run):
    from speedtronic.cli import main

    # A library that keeps an exception raised in an import made during the run (pyparsing's
    # cache, under matplotlib's plot) keeps the frames that made it, the trainer's among them:
    # `speedtronic train` returned with the folder locked until the collector ran.
    gc.disable()
    try:
        argv = ["train", "max_steps: 1\ndevice: cpu", "--set", f"run.output_dir={tmp_path}"]
        assert main(argv) == 0
        holder = other_run(tmp_path.resolve())
        assert holder.pid_line and int(holder.pid_line) == holder.pid
        end(holder)
        trainer, _ = runtime.build_runtime(config(tmp_path))
        runtime.end_run(trainer)  # over: the trainer object may live on
        runtime.end_run(trainer)  # idempotent
        holder = other_run(tmp_path.resolve())
        assert holder.pid_line and int(holder.pid_line) == holder.pid
    finally:
        gc.enable()


def test_a_checkpoint_folder_outside_the_output_folder_is_claimed_too(tmp_path, other_run):
    outside = tmp_path / "shared-checkpoints"
    values = config(tmp_path / "run", checkpoint={"directory": str(outside)})
    assert run_folders(SpeedtronicConfig.from_dict(values)) == [
        (tmp_path / "run").resolve(),
        outside.resolve(),
    ]
    other_run(outside.resolve())
    held = files(outside)
    with pytest.raises(RunFolderBusy, match="shared-checkpoints is in use"):
        runtime.build_runtime(values)
    # Refused, it removed the output folder it made (and its lock file), nothing of the live run.
    assert not (tmp_path / "run").exists()
    assert files(outside) == held
    # The output folder locked before the busy one was let go again.
    runtime.build_runtime(config(tmp_path / "run", checkpoint={"enabled": False}))


def test_a_refused_run_removes_what_it_made_but_never_a_live_runs_lock(tmp_path, other_run):
    from speedtronic.preflight import NewOutputs

    folder = tmp_path / "new" / "run"
    outputs = NewOutputs(SpeedtronicConfig.from_dict(config(folder)))  # before either run began
    holder = other_run(folder.resolve())
    outputs.remove()  # the lock file is new to this run, but another live run holds it
    assert (folder / LOCK_NAME).is_file()
    end(holder)
    outputs.remove()
    assert not (tmp_path / "new").exists()


def test_a_run_refused_as_busy_leaves_the_live_runs_new_files(tmp_path, other_run):
    from speedtronic.preflight import NewOutputs

    folder = tmp_path / "run"
    values = config(folder, logging={"file": str(folder / "train.log")})
    outputs = NewOutputs(SpeedtronicConfig.from_dict(values))  # before either run began
    other_run(folder.resolve())
    (folder / "train.log").write_text("the live run's log\n")  # made after the snapshot
    with pytest.raises(RunFolderBusy), outputs.removed_on_error():
        raise RunFolderBusy("busy")  # refused before this run opened any file of its own
    assert sorted(path.name for path in folder.iterdir()) == [LOCK_NAME, "train.log"]


def train(out, *extra: str, log) -> subprocess.Popen:
    """Start `speedtronic train` on the smoke config in its own process, writing under out."""
    command = [sys.executable, "-m", "speedtronic", "train", str(ROOT / "configs" / "smoke.yaml")]
    command += ["--set", f"run.output_dir={out}", "--set", "checkpoint.every_steps=2", *extra]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as stream:  # the child holds its own descriptor
        return subprocess.Popen(
            command, stdout=stream, stderr=subprocess.STDOUT, env=environment, cwd=ROOT
        )


def files(folder) -> dict[str, tuple[int, int, str]]:
    """Return every file under folder as (size, mtime_ns, sha256), by relative path."""
    return {
        str(path.relative_to(folder)): (
            path.stat().st_size,
            path.stat().st_mtime_ns,
            hashlib.sha256(path.read_bytes()).hexdigest(),
        )
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def refused_line(out, log, *extra: str) -> str:
    """Run a second `speedtronic train` in out to its end; return its one line, once it exits 2."""
    second = train(out, *extra, log=log)
    assert second.wait(timeout=240) == 2, log.read_text()[-3000:]
    said = [line for line in log.read_text().splitlines() if line.startswith("speedtronic")]
    assert len(said) == 1, log.read_text()[-3000:]
    assert "Traceback" not in log.read_text() and "failed (exitcode" not in log.read_text()
    return said[0]


def test_a_second_run_in_a_live_runs_folder_is_refused_and_a_killed_run_blocks_nothing(tmp_path):
    from speedtronic.cli import main

    out = tmp_path / "run"
    first = train(out, "--max-steps", "100000", log=tmp_path / "first.log")
    try:
        wait_for(lambda: latest_step(out) >= 2, "the first run's step-2 checkpoint", first)
        # Held still, so any change to its files while the second run is refused is the
        # second run's.
        first.send_signal(signal.SIGSTOP)
        before = files(out)
        busy = (
            rf"speedtronic train: {out} is in use by another run \(pid {first.pid} on "
            rf"{re.escape(socket.gethostname())}, since "
            r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[+-]\d\d:\d\d\); "
            r"stop it or wait for it to end, or give this run its own run\.output_dir"
        )
        assert re.match(busy, refused_line(out, tmp_path / "second.log")), busy
        # Under torchrun every rank refuses alike, in one line from rank 0.
        ddp = ["--nproc-per-node", "2", "--set", "parallel.data_parallel=ddp"]
        assert re.match(busy, refused_line(out, tmp_path / "ddp.log", *ddp)), busy
        # What only reads the folder works while the run holds it.
        assert main(["sample", str(out / "checkpoints"), "--max-new-tokens", "2"]) == 0
        assert main(["export", str(out / "checkpoints"), str(tmp_path / "export")]) == 0
        assert main(["plot", str(out), "-o", str(tmp_path / "plot.png")]) == 0
        assert files(out) == before
    finally:
        first.kill()  # SIGKILL: the lock file stays, and the kernel has dropped its lock
        first.wait(timeout=60)
    saved = latest_step(out)
    resumed = train(out, "--resume", "--max-steps", str(saved + 1), log=tmp_path / "resumed.log")
    log = (tmp_path / "resumed.log").read_text
    assert resumed.wait(timeout=240) == 0, log()[-3000:]
    assert f"resumed at step {saved}" in log()


def test_a_filesystem_without_locks_trains_unguarded_and_says_so(tmp_path, monkeypatch, capsys):
    from speedtronic.cli import main

    def no_locks(handle, operation):  # what flock says on Lustre mounted without -o flock
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    argv = ["train", "max_steps: 1\ndevice: cpu", "--set", f"run.output_dir={tmp_path}"]
    assert main(argv) == 0  # as in 2.0, which took no lock
    out = capsys.readouterr().out  # the run's log
    assert f"{tmp_path.resolve()} is on a filesystem that keeps no file locks" in out, out
    # A run refused there (a bad data path) still removes the lock file it made.
    folder = tmp_path / "refused"
    argv = ["train", "max_steps: 1\ndevice: cpu\ndata:\n  shard_path: missing/*.bin"]
    assert main([*argv, "--set", f"run.output_dir={folder}"]) == 2
    assert not folder.exists()
