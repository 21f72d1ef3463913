"""A secret scan: recognizable fake tokens enter through the config file, `--set` and the
environment; none may appear in any file or stream a run, an export or a DiLoCo round produces,
inside checkpoint archives included.
"""

from __future__ import annotations

import random
import zipfile
from pathlib import Path

from harness import INPUTS, STREAMS, TOKENS, Result, Timer, run_cli, start_cli, write_config

NEEDLES = [token.encode() for token in TOKENS.values()]


def _hits(data: bytes) -> list[str]:
    return [needle.decode() for needle in NEEDLES if needle in data]


def scan_files(roots: list[Path]) -> tuple[int, int, int, list[str]]:
    """Return (files, bytes, archive members, hits) over every output file under the roots."""
    files = size = members = 0
    hits: list[str] = []
    for root in roots:
        for path in sorted(root.rglob("*")):
            if not path.is_file() or path in INPUTS:
                continue
            data = path.read_bytes()
            files, size = files + 1, size + len(data)
            hits += [f"{path}: {token}" for token in _hits(data)]
            if zipfile.is_zipfile(path):  # checkpoints: scan what the archive holds, unpacked
                with zipfile.ZipFile(path) as archive:
                    for member in archive.namelist():
                        members += 1
                        inner = archive.read(member)
                        hits += [f"{path}!{member}: {token}" for token in _hits(inner)]
    return files, size, members, hits


def _diloco_round(work: Path) -> list[str]:
    """A master and a worker through the CLI over a shared folder, token set everywhere; return
    the failures.
    """
    shared = work / "shared"
    failures = []
    processes = []
    for role in ("master", "worker"):
        config = write_config(
            work / role,
            run={"max_steps": 6},
            distributed={
                "enabled": True,
                "role": role,
                "node_id": role,
                "repo_id": "reliability/secret-scan",
                "transport": "filesystem",
                "endpoint": str(shared),
                "inner_steps": 2,
                "poll_interval": 0.2,
                "global_wait_timeout": 60.0,
            },
        )
        args = ["train", str(config), "--set", f"distributed.token={TOKENS['set']}"]
        processes.append((role, start_cli(args, work)))
    for role, process in processes:
        out, err = process.communicate(timeout=600)
        STREAMS.append((f"secrets/diloco/{role}", out + err))
        if process.returncode != 0:
            failures.append(f"DiLoCo {role} exited {process.returncode}: {err[-300:]}")
    return failures


def run(work: Path, quick: bool, rng: random.Random, roots: list[Path] | None = None) -> Result:
    """Train, validate and export with the tokens set (and a DiLoCo round in full), then scan
    every output under `roots` (default: this probe's folder) and every stream of the suite.
    """
    result = Result("secret scan", "no fake token in any file, archive member or stream")
    timer = Timer()
    # The byte tokenizer exports beside a model with an id for every byte (256).
    config = write_config(work / "train", model={"vocab_size": 256})
    with_token = ["--set", f"distributed.token={TOKENS['set']}"]
    steps = run_cli(["train", str(config), "--max-steps", "3", *with_token], work, label="secrets")
    shown = run_cli(["validate", str(config), *with_token], work, label="secrets/validate")
    checkpoint = work / "train" / "run" / "checkpoints" / "step_3.pt"
    export = run_cli(
        ["export", str(checkpoint), str(work / "export"), "--format", "hf"],
        work,
        label="secrets/export",
    )
    failures = [
        f"{name} exited {proc.returncode}: {proc.stderr[-300:]}"
        for name, proc in (("train", steps), ("validate", shown), ("export", export))
        if proc.returncode != 0
    ]
    if not quick:
        failures += _diloco_round(work / "diloco")
    files, size, members, hits = scan_files(roots or [work])
    stream_hits = [f"{label}: {token}" for label, text in STREAMS for token in _hits(text.encode())]
    for problem in failures + hits + stream_hits:
        result.case(False, problem=problem)
    result.figures = {
        "files": files,
        "megabytes": round(size / 1e6, 1),
        "archive_members": members,
        "streams": len(STREAMS),
        "channels": sorted(TOKENS),
        "hits": len(hits) + len(stream_hits),
        "diloco_round": "skipped (quick)" if quick else "master + worker, filesystem transport",
    }
    result.seconds = timer.seconds
    return result
