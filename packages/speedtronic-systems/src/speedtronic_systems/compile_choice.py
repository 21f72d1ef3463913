"""What `compile: auto` resolves to: torch.compile where the measurements say it pays."""

from __future__ import annotations

import os
import shutil
import sys

import torch

# Measured by tools/bench/bench_cpu_settings.py (break_even_steps in
# tools/bench/results/cpu_settings.json; tests/tools/test_bench_report.py keeps them equal): on
# CPU, torch.compile's one-off cost with an empty compile cache (a first run) over eager, divided
# by the time it saves per step of the main job. A rerun with a warm cache pays back far sooner,
# and larger models save more per step for a similar compile time, so this is the cautious bound.
CPU_COMPILE_BREAK_EVEN_STEPS = 1074
_DEFAULT_CXX = {"darwin": "clang++", "win32": "cl"}.get(sys.platform, "g++")


def inductor_cpp_compiler() -> str | None:
    """Return the path of the C++ compiler torch.compile's inductor would use on CPU, or None
    when there is none.
    """
    # Inductor's own rule (torch._inductor.config.cpp.cxx): the CXX variable, else the platform's
    # compiler; it tries no other name, so neither do we.
    return shutil.which(os.environ.get("CXX", _DEFAULT_CXX)) or None


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
    if inductor_cpp_compiler() is None:
        # Inductor compiles CPU kernels with it: without one the first step fails and falls back.
        cxx = os.environ.get("CXX")
        looked = f"CXX={cxx} not found" if cxx is not None else f"no {_DEFAULT_CXX} on PATH"
        return False, (
            f"auto: no C++ compiler for torch.compile on CPU ({looked}); install one or set CXX"
        )
    return True, (
        f"auto: {planned_steps} steps on CPU; compiling pays after {CPU_COMPILE_BREAK_EVEN_STEPS}"
    )
