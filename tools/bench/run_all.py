"""Run every benchmark under tools/bench (or those named) one after another; each prints its table.

Usage: python tools/bench/run_all.py [optim data precision trainer ...] [-- extra args for each]
Results land in tools/bench/results/<name>.json.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    names, extra = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    scripts = sorted(HERE.glob("bench_*.py"))
    chosen = [s for s in scripts if not names or s.stem.removeprefix("bench_") in names]
    unknown = set(names) - {s.stem.removeprefix("bench_") for s in scripts}
    if unknown:
        print(
            f"unknown benchmark(s) {sorted(unknown)}; choose from {[s.stem[6:] for s in scripts]}"
        )
        return 2
    failed = []
    for script in chosen:
        print(f"=== {script.stem}", flush=True)
        if subprocess.run([sys.executable, str(script), *extra]).returncode != 0:
            failed.append(script.stem)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
