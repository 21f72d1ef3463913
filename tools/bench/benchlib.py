"""Shared pieces of the benchmarks: machine description, the quickstart config, atomic JSON."""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_model() -> tuple[str, list[str]]:
    """Return the CPU model name and which of CPU_FLAGS it reports (Linux /proc/cpuinfo)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), []
    name, flags = platform.machine(), set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            name = value.strip()
        elif key.strip() == "flags":
            flags = set(value.split())
            break
    return name, [flag for flag in CPU_FLAGS if flag in flags]


def machine_info() -> dict[str, Any]:
    """Return what a reader needs to judge a number: CPU, flags, torch, threads, load."""
    import torch

    name, flags = cpu_model()
    info: dict[str, Any] = {
        "cpu": name,
        "cpu_flags": flags,
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "python": platform.python_version(),
        "loadavg": [round(v, 2) for v in os.getloadavg()],
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write payload atomically: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as handle:
        json.dump(payload, handle, indent=2)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def quickstart_values(**sections: dict[str, Any]) -> dict[str, Any]:
    """Return configs/quickstart.yaml as plain data, each given section updated with its fields."""
    from speedtronic_config import SpeedtronicConfig

    values = SpeedtronicConfig.from_yaml(QUICKSTART).to_dict()
    for key in ("shard_path", "val_shard_path"):  # absolute, so any working directory works
        values["data"][key] = str(ROOT / values["data"][key])
    for name, fields in sections.items():
        values[name] = {**values.get(name, {}), **fields}
    return values


def ensure_corpus() -> None:
    """Write the stdlib token shards the main job trains on, once (as `hatch run train` does)."""
    if not list((ROOT / "data" / "stdlib").glob("val_*.bin")):
        subprocess.run(
            [sys.executable, "-m", "speedtronic", "prepare", str(ROOT / "data" / "stdlib")],
            check=True,
        )


def interleaved(variants: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Run each variant once per round, round-robin, rotating the order; return values per name."""
    names = list(variants)
    values: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        shift = index % len(names)  # rotation: no variant always runs first after the others
        for name in names[shift:] + names[:shift]:
            values[name].append(variants[name]())
    return values


def median_ratio(numerator: list[float], denominator: list[float]) -> float:
    """Return the median of the per-round ratios (paired: drift hits both sides of a round)."""
    return statistics.median(a / b for a, b in zip(numerator, denominator, strict=True))


def best_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Return the run with the lowest final held-out loss, never a diverged (non-finite) one:
    min() keeps a NaN it meets first, since nothing compares below it.
    """
    finite = [run for run in runs if math.isfinite(run["final_val_loss"])]
    if not finite:
        raise ValueError(
            f"every run diverged ({len(runs)} runs, no finite held-out loss): lower the lrs tried"
        )
    return min(finite, key=lambda run: run["final_val_loss"])


def rates_text(run: dict[str, Any]) -> str:
    """A convergence run's rates: lr, and the non-matrix parameters' own lr when it had one."""
    other = run.get("other_lr")
    return f"lr {run['lr']:g}" + ("" if other is None else f", non-matrix lr {other:g}")


def mfu_text(mfu: float | None) -> str:
    """An MFU as a percentage, or n/a when the device's peak is unknown."""
    return "n/a" if mfu is None else f"{mfu:.1%}"


def seconds(fn: Callable[[], object]) -> float:
    """Return the wall time of one call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
