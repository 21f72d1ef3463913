"""Run every benchmark, one child process each, then write report.md, plots and the README table.

Usage: python tools/bench/run_all.py [--quick] [--only NAME ...] [--results DIR]
(`hatch run bench [--quick]`, which installs the peers into the `bench` environment).

Full mode (30 minutes on a shared 2-core machine, 22 of them the convergence study) writes
tools/bench/results/ and regenerates the README's performance table from it; --quick (2-6 minutes:
smaller sizes, fewer rounds, no DiLoCo, no compile) writes tools/bench/results/quick/ and leaves the
README alone: it is CI's smoke run of every benchmark, not a measurement to quote. DiLoCo (about 15
minutes) and data parallelism (about 16) run in full mode only when named: `--only diloco`,
`--only parallel`. A failing benchmark fails the run after the others have run. Benchmarks needing
a GPU run only where one is present.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchlib import RESULTS, ROOT, ensure_corpus, machine_info, write_json

HERE = Path(__file__).resolve().parent
# name -> (full-mode arguments, quick-mode arguments or None to skip in quick mode)
BENCHMARKS: dict[str, tuple[list[str], list[str] | None]] = {
    "optim": (["--full", "--repeats", "5"], ["--no-avx2"]),
    "peers": ([], ["--quick"]),
    "trainer": ([], ["--steps", "10", "--rounds", "2"]),
    "cpu_settings": ([], ["--quick"]),
    "precision": ([], ["--quick"]),
    "data": (["--quick"], ["--quick"]),
    "loss_head": ([], ["--rows", "1024", "--vocab", "8192", "--chunks", "256", "--rounds", "2"]),
    "generate": (["--threads", "1"], ["--new-tokens", "32", "--rounds", "2", "--threads", "1"]),
    "convergence": ([], ["--quick"]),
    "diloco": ([], None),
    "parallel": ([], None),
    "gpu": ([], None),
}
ALONE = ("diloco", "parallel")  # full mode only when named with --only: 15 and 16 minutes each
OUT_FLAG = {"diloco": "--output", "parallel": "--output"}


def git_commit() -> str:
    """Return the checked-out commit (with -dirty when the tree has changes), or '?'."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "?"
    return f"{commit}-dirty" if dirty else commit or "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI's few-minute smoke run")
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), default=None)
    parser.add_argument("--results", type=Path, default=None)
    args = parser.parse_args(argv)
    results = args.results or (RESULTS / "quick" if args.quick else RESULTS)
    results.mkdir(parents=True, exist_ok=True)
    ensure_corpus()
    import torch

    chosen = []
    for name, (full, quick) in BENCHMARKS.items():
        if args.only and name not in args.only:
            continue
        if args.quick and quick is None:
            continue
        if name in ALONE and not args.only:
            continue
        if name == "gpu" and not torch.cuda.is_available():
            print("=== gpu: skipped, no CUDA GPU here")
            continue
        chosen.append((name, quick if args.quick else full))
    started = time.perf_counter()
    previous = results / "run.json"
    # --only into the same folder reruns those benchmarks and keeps the others' entries.
    earlier = json.loads(previous.read_text()) if args.only and previous.is_file() else {}
    kept = earlier.get("benchmarks", {})
    here = machine_info()
    run = {
        "benchmark": "run",
        "mode": "quick" if args.quick else "full",
        "command": "hatch run bench" + (" --quick" if args.quick else ""),
        "started": earlier.get("started")
        or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        # The table's machine: an --only rerun elsewhere keeps it, and its rows name their own.
        "machine": earlier.get("machine") or here,
        "benchmarks": dict(kept),
    }
    commit = git_commit()
    failed = []
    for name, extra in chosen:
        script = HERE / f"bench_{name}.py"
        command = [sys.executable, str(script), *extra, OUT_FLAG.get(name, "--out")]
        command.append(str(results / f"{name}.json"))
        print(f"=== {name}: {' '.join(command[1:])}", flush=True)
        before, begun = os.getloadavg(), time.perf_counter()
        stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        code = subprocess.run(command, cwd=ROOT).returncode
        run["benchmarks"][name] = {
            "started": stamp,
            "commit": commit,  # a benchmark rerun with --only later may be at another commit
            # Where it ran, for results that record no CPU of their own (report's _elsewhere).
            "machine": {"cpu": here.get("cpu"), "cpus": here.get("cpus")},
            "seconds": time.perf_counter() - begun,
            "returncode": code,
            "loadavg_before": [round(v, 2) for v in before],
            "loadavg_after": [round(v, 2) for v in os.getloadavg()],
        }
        if code != 0:
            failed.append(name)
    # Every commit the kept results were measured at ("?" for entries from before this field).
    run["commits"] = list(dict.fromkeys(b.get("commit", "?") for b in run["benchmarks"].values()))
    run["duration_s"] = sum(b["seconds"] for b in run["benchmarks"].values())
    loads = [b["loadavg_before"][0] for b in run["benchmarks"].values()]
    loads += [b["loadavg_after"][0] for b in run["benchmarks"].values()]
    run["loadavg_range"] = [min(loads), max(loads)] if loads else None
    write_json(results / "run.json", run)
    report = [sys.executable, str(HERE / "report.py"), "--results", str(results)]
    if not args.quick and args.results is None:
        report.append("--write-readme")
    if subprocess.run(report, cwd=ROOT).returncode != 0:
        failed.append("report")
    print(f"=== done in {(time.perf_counter() - started) / 60:.1f} min; results in {results}")
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
