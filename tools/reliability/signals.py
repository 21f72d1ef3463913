"""SIGTERM/SIGINT: the run checkpoints its current step, exits 143/130 in one line that says how to
resume, skips the slow report, and a resume continues from that step. Measures signal-to-exit on
the reference model the main job trains; in full, also during a whole-split validation pass, and a
2-rank DDP group signalled through its launcher and as a scheduler does (every process) stops at
one step.
"""

from __future__ import annotations

import contextlib
import os
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


def stop_during_evaluation(work: Path) -> dict:
    """SIGTERM a run of the reference model as its step-3 validation pass over a whole split
    (about 1,000 batches) starts: it must end the pass, checkpoint step 3 and exit 143 within
    the same 2 s, logging no val_loss for the cut pass.
    """
    import torch

    from speedtronic_data import write_shard

    work.mkdir(parents=True, exist_ok=True)
    shard = work / "val_000000.bin"
    write_shard(
        shard, torch.randint(0, 256, (2_000_000,), generator=torch.Generator().manual_seed(0))
    )
    config = write_config(
        work,
        model={**REFERENCE_MODEL, "dropout": 0.0},
        data={
            "num_tokens": 4096,
            "micro_batch_size": 16,
            "target_batch_size": 16,
            "val_shard_path": str(shard),
            "eval_every": 3,
            "eval_steps": None,
        },
        run={"max_steps": 100_000},
        checkpoint={"every_steps": 1000},
    )
    seen: list[str] = []
    process = start_cli(["train", str(config)], work, threads=None)
    reached = wait_for_step(process, 3, seen)  # the pass follows this line
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    err = finish(process, seen, "signals/evaluation")
    seconds = time.monotonic() - sent
    stopped = re.search(r"stopped by SIGTERM at step (\d+); checkpoint (\S+);", err)
    figures = {
        "signal": "SIGTERM at a whole-split validation pass",
        "exit": process.returncode,
        "signal_to_exit_s": round(seconds, 3),
        "stopped_at": int(stopped[1]) if stopped else None,
        "checkpoint_written": bool(stopped and Path(stopped[2]).is_file()),
        "pass_cut_short": "cut short, no val_loss" in "".join(seen) + err,
        "val_loss_logged": " eval step=3 " in "".join(seen),
    }
    figures["ok"] = (
        reached
        and process.returncode == CODES[signal.SIGTERM]
        and figures["stopped_at"] == 3
        and figures["checkpoint_written"]
        and figures["pass_cut_short"]
        and not figures["val_loss_logged"]
    )
    return figures


def workers(launcher: int) -> list[int]:
    """Return the pids of the worker processes torchrun's agent in `launcher` started."""
    return [
        int(pid) for pid in Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    ]


def stop_group(work: Path, step: int, every_process: bool = False) -> dict:
    """SIGTERM the launcher of a 2-rank DDP run (a preempted node), or every process of it as
    Slurm's scancel and pkill do (each worker then hears it twice, itself and through torchrun):
    every rank must stop at the same step with one checkpoint holding both ranks' positions, and
    the group exit 143 with one stop line.
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
    ranks = workers(process.pid) if every_process else []
    sent = time.monotonic()
    for pid in [process.pid, *ranks]:  # pkill's order: the launcher's pid is the lowest
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    err = finish(process, seen, "signals/ddp")
    seconds = time.monotonic() - sent
    stopped = re.search(r"stopped by SIGTERM at step (\d+); checkpoint (\S+);", err)
    state = load_checkpoint_file(stopped[2]) if stopped and Path(stopped[2]).is_file() else {}
    whom = "every process of" if every_process else "the launcher of"
    figures = {
        "signal": f"SIGTERM to {whom} 2 DDP ranks",
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
    if not quick:  # a long validation pass to cut: seconds of setup, so the full run only
        during = stop_during_evaluation(work / "evaluation")
        result.case(during.pop("ok"), **during)
    times = sorted(c["signal_to_exit_s"] for c in result.cases)
    groups = []
    if not quick:  # torchrun starts two interpreters: tens of seconds, so the full run only
        for every_process in (False, True):
            folder = work / ("ddp-every-process" if every_process else "ddp")
            group = stop_group(folder, rng.randint(2, 6), every_process)
            result.case(group.pop("ok"), **group)
            groups.append(f"{group['signal']}: {'ok' if result.cases[-1]['ok'] else 'FAILED'}")
    result.figures = {
        "stops": len(result.cases),
        "correct": sum(c["ok"] for c in result.cases),
        "signal_to_exit_s_median": times[len(times) // 2],
        "signal_to_exit_s_max": times[-1],
        "under_2_s": sum(t < 2.0 for t in times),
        "data_parallel": "; ".join(groups) or "not run (quick)",
    }
    if not quick:  # a time goal, for the report; the default tests never judge wall-clock time
        result.passed = result.passed and result.figures["under_2_s"] == len(times)
    result.seconds = timer.seconds
    return result
