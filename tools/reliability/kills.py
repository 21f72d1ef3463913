"""SIGKILL trials: kill a training run at a random moment, mid-write of a checkpoint, or between a
checkpoint's write and its rename, then `--resume`; the resumed run must end bit-equal to an
uninterrupted one.
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

from harness import (
    Result,
    Timer,
    finish,
    last_step,
    load_state,
    run_cli,
    start_cli,
    states_equal,
    temp_files,
    wait_for_step,
    write_config,
)

TARGET = 12  # steps; a checkpoint every 3, the last two kept
EVERY = 3
CHECKPOINT_BYTES = 150_000  # a little less than one checkpoint of the tiny model


def _reference(work: Path) -> tuple[Path, Path]:
    """Train the uninterrupted run once; return (its config, its final checkpoint)."""
    config = write_config(work / "reference")
    result = run_cli(["train", str(config)], work, label="kills/reference")
    if result.returncode != 0:
        raise RuntimeError(f"the uninterrupted reference run failed: {result.stderr[-500:]}")
    return config, work / "reference" / "run" / "checkpoints" / f"step_{TARGET}.pt"


def _kill(work: Path, config: Path, mode: str, rng: random.Random) -> tuple[list[str], str]:
    """Run until killed the `mode` way; return (its stdout lines, how it was killed)."""
    seen: list[str] = []
    if mode == "random":
        process = start_cli(["train", str(config)], work)
        step, share = rng.randint(1, TARGET - 2), rng.random()
        delay = 0.0
        if wait_for_step(process, step, seen):
            # A random moment within the next step (or the checkpoint after it): a share of the
            # step time the cue line reports. The delay is the moment itself, not a wait.
            delay = share * float(seen[-1].split("step_time_s=")[1].split()[0])
            time.sleep(delay)
            process.send_signal(signal.SIGKILL)
        how = f"SIGKILL {delay * 1000:.1f} ms after step {step}"
    else:
        nth = rng.randint(1, TARGET // EVERY - 1)
        size = rng.randint(1, CHECKPOINT_BYTES)
        fault = (
            f"kill-at-rename:step_*.pt:{nth}"
            if mode == "rename"
            else f"kill-mid-write:step_*.pt:{nth}:{size}"
        )
        process = start_cli(["train", str(config)], work, fault=fault)
        how = (
            f"SIGKILL at the rename of checkpoint #{nth}"
            if mode == "rename"
            else (f"SIGKILL after {size:,} bytes of checkpoint #{nth}")
        )
    finish(process, seen, f"kills/{mode}")
    how += f" (exit {process.returncode})"
    return seen, how


def _training_state(path: Path) -> dict:
    """Return a checkpoint's state without its config (which names the run's own folder)."""
    return {key: value for key, value in load_state(path).items() if key != "config"}


def trial(work: Path, reference: Path, mode: str, rng: random.Random) -> dict:
    """One kill and resume; return its figures."""
    config = write_config(work)
    killed, how = _kill(work, config, mode, rng)
    checkpoints = work / "run" / "checkpoints"
    temps_after_kill = len(temp_files(checkpoints))
    resumed = run_cli(["train", str(config), "--resume"], work, label=f"kills/{mode}/resume")
    lines = resumed.stdout.splitlines()
    start = next((line for line in lines if "resumed at step" in line), "")
    resumed_at = int(start.split("resumed at step ")[1].split()[0]) if start else 0
    final = checkpoints / f"step_{TARGET}.pt"
    difference = (
        states_equal(_training_state(reference), _training_state(final))
        if final.is_file()
        else "no final checkpoint"
    )
    figures = {
        "how": how,
        "steps_done_before_kill": last_step(killed),
        "resumed_at": resumed_at,
        "from_complete_checkpoint": bool(start) or resumed_at == 0,
        "steps_lost": max(0, last_step(killed) - resumed_at),
        "temp_files_after_kill": temps_after_kill,
        "temp_files_after_resume": len(temp_files(checkpoints)),
        "resume_exit": resumed.returncode,
        "bit_equal": difference is None,
        "difference": difference,
    }
    figures["ok"] = (
        resumed.returncode == 0 and figures["bit_equal"] and figures["temp_files_after_resume"] == 0
    )
    return figures


def run(work: Path, quick: bool, rng: random.Random) -> Result:
    """Run the trials: quick, one kill at the rename (the window #19 found); else 20, mixed."""
    result = Result("sigkill", "20/20 resume from a complete checkpoint, bit-equal, no temp left")
    timer = Timer()
    _, reference = _reference(work)
    modes = ["rename"] if quick else ["random"] * 8 + ["mid-write"] * 6 + ["rename"] * 6
    rng.shuffle(modes)
    for index, mode in enumerate(modes):
        folder = work / f"trial-{index:02d}-{mode}"
        figures = trial(folder, reference, mode, rng)
        result.case(figures.pop("ok"), mode=mode, **figures)
    good = [c for c in result.cases if c["ok"]]
    result.figures = {
        "trials": len(result.cases),
        "resumed_bit_equal": f"{len(good)}/{len(result.cases)}",
        "from_complete_checkpoint": sum(c["from_complete_checkpoint"] for c in result.cases),
        "max_steps_lost": max((c["steps_lost"] for c in result.cases), default=0),
        "temp_files_after_kill": sum(c["temp_files_after_kill"] for c in result.cases),
        "temp_files_after_resume": sum(c["temp_files_after_resume"] for c in result.cases),
    }
    result.seconds = timer.seconds
    return result
