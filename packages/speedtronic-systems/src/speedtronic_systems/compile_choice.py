"""What `compile: auto` resolves to: torch.compile where the measurements say it pays."""

from __future__ import annotations

import torch

# Measured by tools/bench/bench_cpu_settings.py (break_even_steps in
# tools/bench/results/cpu_settings.json; tests/tools/test_bench_report.py keeps them equal): on
# CPU, torch.compile's one-off cost with an empty compile cache (a first run) over eager, divided
# by the time it saves per step of the main job. A rerun with a warm cache pays back far sooner,
# and larger models save more per step for a similar compile time, so this is the cautious bound.
CPU_COMPILE_BREAK_EVEN_STEPS = 1074


def resolve_compile(
    requested: bool | str, device: torch.device | str, planned_steps: int | None
) -> tuple[bool, str]:
    """Return whether to torch.compile the model for a run of `planned_steps` on `device`, and
    the reason (logged by the trainer).
    """
    if requested != "auto":
        return bool(requested), "set in the config"
    device_type = torch.device(device).type
    if device_type == "cuda":
        return True, "auto on CUDA"
    if device_type != "cpu":
        return False, f"auto: torch.compile is not used on {device_type}"
    if planned_steps is None:
        return False, "auto: the run has no step target to pay back the compile time"
    if planned_steps < CPU_COMPILE_BREAK_EVEN_STEPS:
        return False, (
            f"auto: {planned_steps} steps on CPU are fewer than the "
            f"{CPU_COMPILE_BREAK_EVEN_STEPS} it takes to pay back the compile time"
        )
    return True, (
        f"auto: {planned_steps} steps on CPU; compiling pays after {CPU_COMPILE_BREAK_EVEN_STEPS}"
    )
