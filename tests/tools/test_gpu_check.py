"""tools/gpu_check.sh without a GPU: its dry run (GPU_CHECK_DRY_RUN=1) prints each step's command
and the limit it would get if every step before it used its whole limit.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "gpu_check.sh"
STEPS = ["gpu-124m", "cuda-tests", "main-job", "fsdp", "fsdp-resume", "ddp", "muon", "gpu-profile"]


def dry_run(out: Path, budget: int) -> tuple[subprocess.CompletedProcess, str]:
    env = {
        **os.environ,
        "GPU_CHECK_DRY_RUN": "1",
        "GPU_CHECK_OUT": str(out),
        "GPU_CHECK_BUDGET": str(budget),
        "PYTHON": sys.executable,
    }
    result = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60
    )
    return result, (out / "summary.txt").read_text()


def test_gpu_check_stays_within_its_budget_whatever_its_steps_take(tmp_path: Path) -> None:
    # The next GPU session has 15 minutes of device time, the machine's start included: the
    # steps' limits (each plus the SIGKILL grace) must fit the budget even in the worst case.
    _, summary = dry_run(tmp_path / "tight", 480)
    limits = [int(seconds) for seconds in re.findall(r" limit (\d+)s", summary)]
    assert limits and sum(limits) + 10 * len(limits) <= 480
    assert "skipped" in summary  # the worst case leaves the later steps no time, and says so
    # With time to spare every step runs, in order, each under its own limit.
    result, summary = dry_run(tmp_path / "ample", 10_000)
    assert result.returncode == 0, result.stdout + result.stderr
    ran = [line.split()[0] for line in summary.splitlines()]
    assert [name for name in ran if name != "prepare"] == STEPS
    for script in re.findall(r"tools/bench/\w+\.py", result.stdout):
        assert (ROOT / script).is_file(), script
