"""Full and read-only disks on every path a run writes: the run stops (or never starts) with one
line, and the previous checkpoint and `latest` are intact and loadable afterwards.

Write hooks (tools/reliability/inject.py) fail a chosen write with ENOSPC or EROFS; where this
machine allows unprivileged mount namespaces (`unshare -rm`), a real tmpfs that fills up and a real
read-only bind mount are used too.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

from harness import (
    STREAMS,
    Result,
    Timer,
    changed,
    child_env,
    load_state,
    one_line_error,
    run_cli,
    snapshot,
    temp_files,
    write_config,
)

# (name, fault, expected exit, stderr fragments, what must hold afterwards)
HOOKED = [
    (
        "checkpoint file, mid-write",
        "enospc:step_*.pt:2:20000",
        1,
        ("no space left on", "while writing step 6", "previous checkpoint is intact (step_3.pt)"),
        "latest=3",
    ),
    (
        "latest pointer",
        "enospc:latest:2:10",
        1,
        ("no space left on", "while writing step 6", "previous checkpoint is intact (step_3.pt)"),
        "latest=3",
    ),
    (
        "metrics file, mid-run",
        "enospc:metrics.jsonl:1:3000",
        1,
        ("emergency checkpoint", "--resume"),
        "emergency",
    ),
    (
        "checkpoint folder turns read-only",
        "erofs:step_*.pt:2",
        1,
        ("cannot write", "Read-only file system", "previous checkpoint is intact (step_3.pt)"),
        "latest=3",
    ),
    ("loss-curve PNG after training", "enospc:loss_curve.png:1:0", 0, (), "latest=12"),
    (
        "read-only output at start",
        "erofs:.speedtronic-probe.tmp:1",
        2,
        ("run.output_dir: cannot write", "Read-only file system"),
        "nothing",
    ),
]


def _latest(run: Path) -> int | None:
    pointer = run / "checkpoints" / "latest"
    return json.loads(pointer.read_text())["step"] if pointer.is_file() else None


def _intact(run: Path, expect: str) -> str | None:
    """Return what is wrong with the checkpoints after the fault, or None."""
    checkpoints = run / "checkpoints"
    if expect == "nothing":
        written = [p for p in checkpoints.glob("*")] if checkpoints.exists() else []
        return f"wrote {written}" if written else None
    step = _latest(run)
    if step is None:
        return "no latest pointer"
    if expect.startswith("latest=") and step != int(expect.split("=")[1]):
        return f"latest names step {step}, expected {expect}"
    try:
        state = load_state(checkpoints / f"step_{step}.pt")
    except Exception as error:
        return f"latest checkpoint does not load: {error}"
    if state["step"] != step:
        return f"latest checkpoint holds step {state['step']}"
    leftovers = temp_files(checkpoints)
    return f"temp files left: {leftovers}" if leftovers else None


def hooked(work: Path, case: tuple) -> dict:
    """One injected fault on a fresh tiny run."""
    name, fault, code, fragments, expect = case
    config = write_config(work, checkpoint={"every_steps": 3, "keep_last": None})
    proc = run_cli(["train", str(config)], work, fault=fault, label=f"disks/{name}")
    problem = (
        one_line_error(proc, code, *fragments)
        if code
        else (None if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr[-300:]}")
    )
    damage = _intact(work / "run", expect)
    return {
        "case": name,
        "method": "write hook",
        "exit": proc.returncode,
        "stderr": proc.stderr.strip()[:300],
        "problem": problem or damage,
    }


def _namespace_works() -> bool:
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    return probe.returncode == 0


def _in_namespace(script: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run a shell script in a private mount namespace (mounts vanish with it)."""
    result = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script],
        cwd=cwd,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    STREAMS.append(("disks/namespace", result.stdout + result.stderr))
    return result


def real_full_disk(work: Path) -> dict:
    """A tmpfs with room for about two and a half checkpoints: the third save hits ENOSPC."""
    mount = work / "tmpfs"
    mount.mkdir(parents=True)
    config = write_config(
        work,
        run={"output_dir": str(mount / "run")},
        checkpoint={"every_steps": 3, "keep_last": None},
        logging={"json_file": str(work / "metrics.jsonl")},
    )
    train = " ".join([sys.executable, "-m", "speedtronic", "train", str(config)])
    script = (
        f"mount -t tmpfs -o size=1000k tmpfs {mount} && {train}; code=$?; "
        f"cp -r {mount}/run {work}/after; exit $code"
    )
    proc = _in_namespace(script, work)
    problem = one_line_error(proc, 1, "no space left on", "previous checkpoint is intact")
    return {
        "case": "checkpoint fills the disk",
        "method": "tmpfs",
        "exit": proc.returncode,
        "stderr": proc.stderr.strip()[:300],
        "problem": problem or _intact(work / "after", "latest"),
    }


def real_read_only(work: Path) -> dict:
    """A finished run's folder mounted read-only: --resume refuses at start; nothing changes."""
    config = write_config(work, run={"max_steps": 3})
    first = run_cli(["train", str(config)], work, label="disks/read-only/first")
    if first.returncode != 0:
        return {
            "case": "resume on a read-only folder",
            "method": "bind mount",
            "exit": -1,
            "problem": f"first run failed: {first.stderr[-300:]}",
        }
    before = snapshot(work / "run")
    train = " ".join(
        [sys.executable, "-m", "speedtronic", "train", str(config), "--resume", "--max-steps", "6"]
    )
    script = f"mount --bind -o ro {work}/run {work}/run && {train}"
    proc = _in_namespace(script, work)
    problem = one_line_error(proc, 2, "cannot write", "Read-only file system")
    touched = changed(before)
    return {
        "case": "resume on a read-only folder",
        "method": "bind mount",
        "exit": proc.returncode,
        "stderr": proc.stderr.strip()[:300],
        "problem": problem or (touched or None),
    }


def run(work: Path, quick: bool, rng: random.Random) -> Result:
    """Every hooked fault (quick: two), then the real filesystems where they can be had."""
    result = Result("full and read-only disks", "one line; previous checkpoint and latest intact")
    timer = Timer()
    chosen = [HOOKED[0], HOOKED[5]] if quick else HOOKED
    for index, case in enumerate(chosen):
        figures = hooked(work / f"hook-{index}", case)
        result.case(figures["problem"] is None, **figures)
    real = _namespace_works()
    if real and not quick:
        for probe in (real_full_disk, real_read_only):
            figures = probe(work / probe.__name__)
            result.case(figures["problem"] is None, **figures)
    result.figures = {
        "cases": len(result.cases),
        "intact": sum(c["ok"] for c in result.cases),
        "real_filesystems": "tmpfs + read-only bind mount" if real and not quick else "skipped",
    }
    for folder in work.glob("*/tmpfs"):
        shutil.rmtree(folder, ignore_errors=True)
    result.seconds = timer.seconds
    return result
