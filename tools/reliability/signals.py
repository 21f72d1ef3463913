"""SIGTERM/SIGINT: the run checkpoints its current step, exits 143/130 in one line that says how to
resume, skips the slow report, and a resume continues from that step. Measures signal-to-exit on
the reference model the main job trains; in full, a 2-rank DDP group stops at one step too.
"""

from __future__ import annotations

import random
import re
import signal
import time
from pathlib import Path

from harness import (
    TOKENS,
    Result,
    Timer,
    finish,
    run_cli,
    start_cli,
    wait_for_step,
    write_config,
)

CODES = {signal.SIGTERM: 143, signal.SIGINT: 130}
# configs/quickstart.yaml's model and batch on synthetic tokens: the step a scheduler interrupts.
REFERENCE_MODEL = {"vocab_size": 256, "max_seq_len": 128, "n_layer": 4, "n_head": 4, "d_model": 128}


def stop_once(work: Path, signum: signal.Signals, step: int, full: bool) -> dict:
    """Signal a run after `step` (the reference model, and a resume, in full; else the tiny
    model); return what it did.
    """
    sizes = {
        "model": {**REFERENCE_MODEL, "dropout": 0.0},
        "data": {"num_tokens": 4096, "micro_batch_size": 16, "target_batch_size": 16},
    }
    config = write_config(
        work,
        **(sizes if full else {}),
        run={"max_steps": 100_000},
        checkpoint={"every_steps": 1000},
    )
    seen: list[str] = []
    # Real threads: the grace period is measured as a user would see it.
    with_token = ["--set", f"distributed.token={TOKENS['set']}"]
    process = start_cli(["train", str(config), *with_token], work, threads=None)
    reached = wait_for_step(process, step, seen)
    sent = time.monotonic()
    process.send_signal(signum)
    err = finish(process, seen, f"signals/{signum.name}")
    seconds = time.monotonic() - sent
    stopped = re.search(r"stopped by (SIG\w+) at step (\d+); checkpoint (\S+);", err)
    checkpoint = Path(stopped[3]) if stopped else None
    figures = {
        "signal": signum.name,
        "exit": process.returncode,
        "signal_to_exit_s": round(seconds, 3),
        "stopped_at": int(stopped[2]) if stopped else None,
        "checkpoint_written": bool(checkpoint and checkpoint.is_file()),
        "one_line": len(err.strip().splitlines()) == 1 and "Traceback" not in err,
        "resume_command": "--resume" in err,
        "token_hidden": TOKENS["set"] not in "".join(seen) + err and "<secret>" in err,
        "report_skipped": "sample:" not in "".join(seen) and "trained " not in "".join(seen),
    }
    ok = (
        reached
        and process.returncode == CODES[signum]
        and figures["checkpoint_written"]
        and figures["one_line"]
        and figures["resume_command"]
        and figures["token_hidden"]
        and figures["report_skipped"]
    )
    if full and stopped:
        target = figures["stopped_at"] + 1
        again = run_cli(
            ["train", str(config), "--resume", "--max-steps", str(target)],
            work,
            label=f"signals/{signum.name}/resume",
        )
        figures["resumed_at"] = int(re.search(r"resumed at step (\d+)", again.stdout)[1])
        ok = ok and again.returncode == 0 and figures["resumed_at"] == figures["stopped_at"]
    figures["ok"] = ok
    return figures


def stop_group(work: Path, step: int) -> dict:
    """SIGTERM the launcher of a 2-rank DDP run (a preempted node): every rank must stop at the
    same step with one checkpoint holding both ranks' positions, and the group exit 143.
    """
    from speedtronic_trainer.checkpoint_checks import load_checkpoint_file

    config = write_config(
        work,
        run={"max_steps": 100_000},
        checkpoint={"every_steps": 1000},
        parallel={"data_parallel": "ddp"},
    )
    seen: list[str] = []
    process = start_cli(["train", str(config), "--nproc-per-node", "2"], work, threads=None)
    reached = wait_for_step(process, step, seen)
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    err = finish(process, seen, "signals/ddp")
    seconds = time.monotonic() - sent
    stopped = re.search(r"stopped by SIGTERM at step (\d+); checkpoint (\S+);", err)
    state = load_checkpoint_file(stopped[2]) if stopped and Path(stopped[2]).is_file() else {}
    figures = {
        "signal": "SIGTERM to the launcher of 2 DDP ranks",
        "exit": process.returncode,
        "signal_to_exit_s": round(seconds, 3),
        "stopped_at": int(stopped[1]) if stopped else None,
        "announced_once": err.count("stopped by SIGTERM at step") == 1,
        "ranks_in_checkpoint": len(state.get("rank_states") or []),
    }
    figures["ok"] = (
        reached
        and process.returncode == CODES[signal.SIGTERM]
        and figures["announced_once"]
        and state.get("step") == figures["stopped_at"]
        and figures["ranks_in_checkpoint"] == 2
    )
    return figures


def run(work: Path, quick: bool, rng: random.Random) -> Result:
    """SIGTERM and SIGINT once each on the tiny model (quick), or three times each on the
    reference model, with a resume (full).
    """
    result = Result("signals", "exit 143/130 with a checkpoint and the resume command, < 2 s")
    timer = Timer()
    repeats = 1 if quick else 3
    for index in range(repeats):
        for signum in CODES:
            step = rng.randint(2, 6)
            folder = work / f"{signum.name}-{index}"
            figures = stop_once(folder, signum, step, full=not quick)
            result.case(figures.pop("ok"), **figures)
    times = sorted(c["signal_to_exit_s"] for c in result.cases)
    if not quick:  # torchrun starts two interpreters: tens of seconds, so the full run only
        group = stop_group(work / "ddp", rng.randint(2, 6))
        result.case(group.pop("ok"), **group)
    result.figures = {
        "stops": len(result.cases),
        "correct": sum(c["ok"] for c in result.cases),
        "signal_to_exit_s_median": times[len(times) // 2],
        "signal_to_exit_s_max": times[-1],
        "under_2_s": sum(t < 2.0 for t in times),
        "data_parallel": "not run (quick)"
        if quick
        else f"2 DDP ranks, launcher signalled: {'ok' if result.cases[-1]['ok'] else 'FAILED'}",
    }
    if not quick:  # a time goal, for the report; the default tests never judge wall-clock time
        result.passed = result.passed and result.figures["under_2_s"] == len(times)
    result.seconds = timer.seconds
    return result
