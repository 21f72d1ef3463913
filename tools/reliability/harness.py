"""What every reliability probe shares: real CLI processes, a tiny run's config, fake secrets, and
checks on exit codes, stderr, files and checkpoint states.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
INJECT = Path(__file__).resolve().parent / "inject.py"
# Recognizable fake tokens, one per way a secret reaches a run; none may appear in any output.
TOKENS = {
    "config": "hf_RELIABILITYfakeCONFIGtoken000001",
    "set": "hf_RELIABILITYfakeSETtoken000000002",
    "env": "hf_RELIABILITYfakeENVtoken000000003",
}
STREAMS: list[tuple[str, str]] = []  # (label, stdout+stderr) of every process, for the scan
INPUTS: set[Path] = set()  # files a probe wrote as input (they hold the config token on purpose)


@dataclass
class Result:
    """One probe's outcome: whether it met its goal, its headline figures and each case."""

    name: str
    goal: str
    passed: bool = True
    figures: dict[str, Any] = field(default_factory=dict)
    cases: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def case(self, ok: bool, **details: Any) -> None:
        """Record one case; a failed case fails the probe."""
        self.cases.append({"ok": ok, **details})
        self.passed = self.passed and ok


def child_env(threads: int | None = 1) -> dict[str, str]:
    """Return the environment of a CLI process: the env token set, one thread for bit-exactness."""
    env = {k: v for k, v in os.environ.items() if k != "SPEEDTRONIC_DEBUG"}
    env["HF_TOKEN"] = env["HUGGING_FACE_HUB_TOKEN"] = TOKENS["env"]
    env["PYTHONUNBUFFERED"] = "1"  # step lines arrive as they happen
    if threads is not None:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


def command(args: list[str], fault: str | None = None) -> list[str]:
    """Return the argv of `speedtronic ARGS`, through the fault injector when `fault` is given."""
    if fault is None:
        return [sys.executable, "-m", "speedtronic", *args]
    return [sys.executable, str(INJECT), fault, "--", *args]


def run_cli(
    args: list[str],
    cwd: Path,
    *,
    fault: str | None = None,
    label: str = "",
    timeout: float = 600,
    threads: int | None = 1,
) -> subprocess.CompletedProcess:
    """Run the CLI to completion and keep its output for the secret scan."""
    result = subprocess.run(
        command(args, fault),
        cwd=cwd,
        env=child_env(threads),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    STREAMS.append((label or " ".join(args[:2]), result.stdout + result.stderr))
    return result


def start_cli(
    args: list[str], cwd: Path, *, fault: str | None = None, threads: int | None = 1
) -> subprocess.Popen:
    """Start the CLI with piped output (read stdout line by line to wait on its steps)."""
    return subprocess.Popen(
        command(args, fault),
        cwd=cwd,
        env=child_env(threads),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_step(process: subprocess.Popen, step: int, seen: list[str]) -> bool:
    """Read the process's stdout until it logs train step `step` (event-driven: the line is the
    cue); keep every line in `seen`; return False when it exits first.
    """
    cue = f" train_step step={step} "
    for line in process.stdout:
        seen.append(line)
        if cue in line:
            return True
    return False


def finish(process: subprocess.Popen, seen: list[str], label: str, timeout: float = 600) -> str:
    """Wait for the process and return its stderr; its output joins the secret scan."""
    out, err = process.communicate(timeout=timeout)
    seen.append(out)
    STREAMS.append((label, "".join(seen) + err))
    return err


def last_step(lines: list[str]) -> int:
    """Return the highest `train_step step=N` in the lines, 0 if none."""
    steps = [
        int(part.split("=")[1])
        for line in "".join(lines).splitlines()
        for part in line.split()
        if part.startswith("step=") and " train_step " in line
    ]
    return max(steps, default=0)


def write_config(folder: Path, name: str = "run.yaml", **sections: Any) -> Path:
    """Write a tiny reference-model config (seconds per run on 2 cores, dropout and shuffling on,
    so RNG and data position matter for an exact resume) with the config token; return its path.
    """
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "run": {"name": "reliability", "seed": 7, "device": "cpu", "max_steps": 12},
        "model": {
            "vocab_size": 128,
            "max_seq_len": 32,
            "n_layer": 2,
            "n_head": 2,
            "d_model": 32,
            "dropout": 0.1,
        },
        "data": {"num_tokens": 64, "micro_batch_size": 4, "target_batch_size": 8, "shuffle": True},
        "optimizer": {"name": "muon", "lr": 0.01},
        "scheduler": {"warmup_steps": 2},
        "precision": "fp32",
        "checkpoint": {"every_steps": 3, "keep_last": 2},
        "logging": {"every_steps": 1, "progress": False},
        "distributed": {"token": TOKENS["config"]},
    }
    config["run"]["output_dir"] = str(folder / "run")
    config["logging"]["json_file"] = str(folder / "run" / "metrics.jsonl")
    for section, values in sections.items():
        config[section] = {**config.get(section, {}), **values}
    path = folder / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    INPUTS.add(path)
    return path


def one_line_error(result: Any, code: int, *fragments: str) -> str | None:
    """Return what is wrong with a failed command's exit code and stderr, or None when it is one
    line, without a traceback, holding every fragment.
    """
    stderr = result.stderr if isinstance(result.stderr, str) else ""
    lines = [line for line in stderr.splitlines() if line.strip()]
    if result.returncode != code:
        return f"exit {result.returncode}, expected {code}: {stderr.strip()[-300:]}"
    if "Traceback" in stderr:
        return "traceback on stderr"
    if len(lines) != 1:
        return f"{len(lines)} lines on stderr: {stderr.strip()[:300]}"
    missing = [f for f in fragments if f not in stderr]
    return f"stderr lacks {missing}: {stderr.strip()[:300]}" if missing else None


def snapshot(folder: Path) -> dict[str, tuple[int, int, str]]:
    """Return every file under folder as (size, mtime_ns, sha256), but the run lock: each run
    that starts in a folder writes its own pid into it (it holds no data).
    """
    from speedtronic.run_lock import LOCK_NAME

    found = {}
    for path in sorted(folder.rglob("*")) if folder.exists() else []:
        if path.is_file() and path.name != LOCK_NAME:
            data = path.read_bytes()
            stat = path.stat()
            found[str(path)] = (stat.st_size, stat.st_mtime_ns, hashlib.sha256(data).hexdigest())
    return found


def changed(before: dict[str, tuple[int, int, str]]) -> list[str]:
    """Return the files of a snapshot that were deleted or overwritten since."""
    problems = []
    for name, (*_, digest) in before.items():
        path = Path(name)
        if not path.is_file():
            problems.append(f"deleted {name}")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            problems.append(f"overwritten {name}")
    return problems


def temp_files(folder: Path) -> list[Path]:
    """Return the hidden temp files under folder."""
    return sorted(p for p in folder.rglob(".*.tmp")) if folder.exists() else []


def load_state(path: Path) -> dict[str, Any]:
    """Return a checkpoint's state (weights only)."""
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def states_equal(a: Any, b: Any, where: str = "") -> str | None:
    """Return the first path where two checkpoint states differ (tensors bit for bit), or None."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
        return None if same else where or "<root>"
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return f"{where}: keys {sorted(set(a) ^ set(b), key=str)}"
        for key in a:
            found = states_equal(a[key], b[key], f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{where}: lengths {len(a)} != {len(b)}"
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            found = states_equal(x, y, f"{where}[{index}]")
            if found:
                return found
        return None
    return None if a == b else f"{where}: {a!r} != {b!r}"


class Timer:
    """Seconds since construction (for the report, never for a pass/fail decision in a test)."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    @property
    def seconds(self) -> float:
        """Return the seconds elapsed."""
        return time.monotonic() - self.start
