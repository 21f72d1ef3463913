"""What `run.cpu_allocator` does: keep freed host memory in the process instead of handing it
back to the OS after every step.

PyTorch allocates CPU tensors with the C library's malloc. glibc returns the free memory at the
top of its heap to the OS once more than its trim threshold is free, and serves blocks from
128 KiB up (its starting mmap threshold) with fresh mappings; a training step frees and
reallocates the same activations every step, so both hand them back and page-fault them in again,
zeroed by the kernel: about 13,000 page faults a step for the main job. Keeping them (what
PyTorch's caching allocator does for CUDA) was measured by tools/bench/bench_cpu_settings.py
(`allocator` in tools/bench/results/cpu_settings.json). It is a process-wide setting of glibc's
malloc: once on, it stays on for the life of the process.
"""

from __future__ import annotations

import ctypes
import logging
import platform
import sys

import torch

# Blocks up to this size come from the heap, which keeps them; larger ones are mapped per use.
# 32 MiB is the ceiling glibc's own dynamic threshold reaches on 64-bit, so this is a threshold
# glibc already runs with, fixed from the first step instead of reached after trims.
MMAP_THRESHOLD_BYTES = 32 << 20
# mallopt takes an int: the largest one means the heap is never trimmed in practice, so RSS stays
# at the run's peak (the peak itself does not change: measured within 3%).
TRIM_THRESHOLD_BYTES = 2**31 - 1

_M_TRIM_THRESHOLD = -1  # mallopt parameter numbers from glibc's malloc.h
_M_MMAP_THRESHOLD = -3

_enabled = False


def caching_available() -> bool:
    """Return whether this process's malloc can be switched to caching (glibc on Linux)."""
    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def caching_enabled() -> bool:
    """Return whether this process switched its malloc to caching."""
    return _enabled


def resolve_cpu_allocator(requested: str, device: torch.device | str) -> tuple[bool, str]:
    """Return whether `run.cpu_allocator: requested` switches malloc to caching for a run on
    `device`, and the reason (logged by the trainer).
    """
    if requested == "default":
        return False, "set in the config"
    if not caching_available():
        return False, f"needs glibc malloc on Linux; this is {platform.system()} " + (
            platform.libc_ver()[0] or "without glibc"
        )
    if requested == "caching":
        return True, "set in the config"
    device_type = torch.device(device).type
    if device_type != "cpu":
        return False, f"auto: the model's memory is on {device_type}, not in malloc's heap"
    return True, "auto: training on CPU with glibc"


def enable_caching() -> None:
    """Switch glibc's malloc, for the rest of this process, to keep freed memory for reuse."""
    global _enabled
    if _enabled:
        return
    libc = ctypes.CDLL(None)
    for parameter, value in (
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
        (_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
    ):
        if libc.mallopt(parameter, value) != 1:
            raise OSError(f"glibc mallopt({parameter}, {value}) refused the setting")
    _enabled = True


def apply_cpu_allocator(requested: str, device: torch.device | str, logger: logging.Logger) -> bool:
    """Resolve `run.cpu_allocator`, switch malloc to caching when it says so, log the choice and
    return whether caching is on in this process.
    """
    wanted, why = resolve_cpu_allocator(requested, device)
    if requested == "caching" and not wanted:
        logger.warning("run.cpu_allocator: caching is not available (%s); using the default", why)
    elif requested == "default" and _enabled:
        logger.warning(
            "run.cpu_allocator: default, but an earlier run in this process switched malloc to "
            "caching and it cannot be switched back; start a new process for the default"
        )
    if wanted and not _enabled:
        try:
            enable_caching()
        except OSError as exc:  # a speed setting, not a requirement: degrade and say so
            logger.warning("run.cpu_allocator: %s; using the default", exc)
            return False
    if requested == "auto":
        logger.info("cpu_allocator: auto -> %s (%s)", "caching" if wanted else "default", why)
    return _enabled
