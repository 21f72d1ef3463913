"""How `speedtronic train` ends when it does not finish: stopped by a signal, or failed after it
started. Each is one line on stderr that says what was saved and the command that resumes.
"""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path
from typing import Any

from speedtronic.errors import (
    PEER_FAILED,
    RunFailed,
    first_line,
    peer_failed,
    print_line,
    signal_exit_code,
)
from speedtronic_config.errors import on_every_rank, raised_on_every_rank
from speedtronic_config.secrets import is_secret_path
from speedtronic_systems.parallel import elastic_restarts

# What a stop line says instead of the resume command when the run reached its step target.
TARGET_REACHED = "that is the step target: nothing is left to resume"
# ... and when the run saved nothing (checkpoint.enabled: false) and resumed from nothing:
# --resume would start at step 0.
_NOTHING_SAVED = "this stop left nothing to resume"


def resume_command(args: argparse.Namespace) -> str:
    """Return the `speedtronic train ... --resume` command that continues this run; a secret
    override is shown as a placeholder, never its value. Under `hatch run` it starts with
    `hatch run`: the console script is on the hatch environment's PATH, not the shell's.
    """
    words = ["speedtronic", "train", args.config]
    if env := os.environ.get("HATCH_ENV_ACTIVE"):
        words[:1] = ["hatch", "run", "speedtronic" if env == "default" else f"{env}:speedtronic"]
    if getattr(args, "nproc_per_node", None) is not None:  # torchrun's launcher: launch again
        words += ["--nproc-per-node", str(args.nproc_per_node)]
        if args.rdzv_endpoint:
            words += ["--nnodes", args.nnodes, "--rdzv-endpoint", args.rdzv_endpoint]
        if args.max_restarts:
            words += ["--max-restarts", str(args.max_restarts)]
        if args.shutdown_timeout is not None:
            words += ["--shutdown-timeout", str(args.shutdown_timeout)]
    elif int(os.environ.get("WORLD_SIZE", "1")) > 1:  # a torchrun worker: relaunch the group
        words += ["--nproc-per-node", os.environ.get("LOCAL_WORLD_SIZE", "1")]
        if os.environ["WORLD_SIZE"] != os.environ.get("LOCAL_WORLD_SIZE"):
            words += ["--nnodes", "M", "--rdzv-endpoint", "HOST:PORT"]  # the same on every node
    for override in args.overrides:
        key = override.partition("=")[0]
        words += ["--set", f"{key}=<secret>" if is_secret_path(key) else override]
    for flag, value in (
        ("--max-steps", args.max_steps),
        ("--device", args.device),
        ("--cuda-overlay", args.cuda_overlay),
    ):
        if value is not None:
            words += [flag, str(value)]
    return shlex.join([*words, "--resume"])


def restart_note() -> str | None:
    """Return what follows a torchrun worker's stop or failure while --max-restarts has restarts
    left (torchrun restarts the group after any worker exits, unless it was stopped itself), else
    None.
    """
    made, allowed = elastic_restarts()
    left = allowed - made
    if left <= 0:
        return None
    return f"torchrun restarts the workers from the latest checkpoint (restarts left: {left})"


def report_signal_stop(
    result: Any,
    args: argparse.Namespace,
    *,
    announce: bool = True,
    target: int | None = None,
    resumed: Path | None = None,
) -> int:
    """Say where a signal-stopped run saved its state and how to resume (when `announce`: one
    rank speaks for a data-parallel group); return its exit code. A run stopped at its step
    `target` (in its last step or its last evaluation) has nothing left to resume; one that saved
    nothing but `resumed` from a checkpoint can resume from that one again.
    """
    if not announce:
        return signal_exit_code(result.stopped_by)
    if result.checkpoint is None:  # checkpoint.enabled: false
        saved, then = "no checkpoint written (checkpoint.enabled is false)", _NOTHING_SAVED
        if resumed is not None:  # --resume goes back to it, losing this run's steps
            command = resume_command(args)
            then = f"resume with: {command} (from {resumed.name}, where this run began)"
    else:
        saved = f"checkpoint {result.checkpoint}"
        then = f"resume with: {resume_command(args)}"
        if target is not None and result.steps >= target:
            then = TARGET_REACHED
        # A SIGTERM from torchrun after another worker failed, or from a scheduler stopping it too.
        elif (restart := restart_note()) is not None:
            then = f"{restart}, unless torchrun itself was stopped: then {then}"
    print_line(
        f"speedtronic train: stopped by {result.stopped_by} at step {result.steps}; {saved}; {then}"
    )
    return signal_exit_code(result.stopped_by)


def run_failed(error: Exception, trainer: Any, args: argparse.Namespace) -> RunFailed:
    """Return the one-line failure of a started run: the error, the emergency checkpoint written
    (or the last good one), and the command that resumes. An error every rank raised alike stays
    so marked: rank 0 then reports it for the group.
    """
    failed = RunFailed(_failure_line(error, trainer, args))
    return on_every_rank(failed) if raised_on_every_rank(error) else failed


def _failure_line(error: Exception, trainer: Any, args: argparse.Namespace) -> str:
    first = first_line(error)
    what = f"{type(error).__name__}: {first}" if first else type(error).__name__
    if peer_failed(error):  # gloo's text would read as this rank's own failure
        what = PEER_FAILED
    from speedtronic_trainer import CheckpointError

    if (restart := restart_note()) is not None:  # torchrun restarts the group, not the user
        return f"{what}; {restart}"
    saved: Path | None = trainer.emergency_checkpoint
    latest: Path | None = trainer.last_checkpoint  # not an earlier run's it started fresh beside
    if saved is not None:
        where = f"emergency checkpoint of the last sound step: {saved}"
    elif isinstance(error, CheckpointError):
        # A failed save already names this run's checkpoint that is intact, or says it has none.
        then = f"resume with: {resume_command(args)}" if latest is not None else "start it again"
        return f"{what}; fix the cause, then {then}"
    elif latest is not None:
        where = f"latest checkpoint: {latest}"
    else:
        manager = trainer.checkpoint_manager
        earlier = manager.latest_path() if manager is not None else None
        note = f" ({earlier} is an earlier run's)" if earlier is not None else ""
        return f"{what}; no checkpoint of this run was written{note}"
    return f"{what}; {where}; fix the cause, then resume with: {resume_command(args)}"


__all__ = [
    "TARGET_REACHED",
    "report_signal_stop",
    "restart_note",
    "resume_command",
    "run_failed",
]
