"""Run the reliability probes and write a JSON and a Markdown report.

Usage: python tools/reliability/run.py [--quick] [--only NAME ...] [--seed N] [--out DIR]
(`hatch run reliability [--quick]`). Full: 20 SIGKILL trials, 9 signal stops, the whole bad-input
corpus, 1,000 + 1,000 fuzzed configs, every disk fault, a secret scan of everything the suite
wrote. Quick: a few of each (what the default tests run). Exit 0 when every probe met its goal.
Results: tools/reliability/results/reliability[-quick].{json,md}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import corpus  # noqa: E402
import disks  # noqa: E402
import fuzz  # noqa: E402
import kills  # noqa: E402
import secrets_scan  # noqa: E402
import signals  # noqa: E402
from harness import Result  # noqa: E402

PROBES = {
    "kills": kills,
    "signals": signals,
    "corpus": corpus,
    "fuzz": fuzz,
    "disks": disks,
    "secrets": secrets_scan,  # last: it scans what every probe before it wrote and printed
}


def machine() -> dict:
    """Return what the figures depend on: CPU, cores, load, Python and torch."""
    import torch

    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor(),
        )
        if Path("/proc/cpuinfo").exists()
        else platform.processor()
    )
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def markdown(report: dict) -> str:
    """Return the report as a Markdown table with the command and the machine."""
    lines = [
        f"# Reliability ({report['mode']})",
        "",
        f"`{report['command']}` on {report['date']}: {report['machine']['cpu']}, "
        f"{report['machine']['cores']} cores, load average {report['machine']['load_average']} "
        f"at the start and {report['load_average_end']} at the end, Python "
        f"{report['machine']['python']}, torch {report['machine']['torch']}; "
        f"seed {report['seed']}.",
        "",
        "| probe | goal | met | figures | seconds |",
        "|---|---|---|---|---|",
    ]
    for probe in report["probes"]:
        figures = "; ".join(f"{k} {v}" for k, v in probe["figures"].items())
        met = "yes" if probe["passed"] else "**no**"
        lines.append(
            f"| {probe['name']} | {probe['goal']} | {met} | {figures} | {probe['seconds']:.0f} |"
        )
    failed = [
        (probe["name"], case)
        for probe in report["probes"]
        for case in probe["cases"]
        if not case.get("ok", True)
    ]
    if failed:
        lines += ["", "## Failed cases", ""]
        lines += [f"- {name}: {json.dumps(case, default=str)[:400]}" for name, case in failed]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """Run the chosen probes; write the reports; return 0 when every goal was met."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few of each (seconds, not minutes)")
    parser.add_argument("--only", nargs="*", choices=sorted(PROBES), help="run only these probes")
    parser.add_argument("--seed", type=int, default=19, help="seed of every random choice")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="report folder")
    parser.add_argument("--work", type=Path, help="keep the probes' files here (default: a temp)")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    start = machine()
    work = args.work or Path(tempfile.mkdtemp(prefix="speedtronic-reliability-"))
    results: list[Result] = []
    for name, probe in PROBES.items():
        if args.only and name not in args.only:
            continue
        folder = work / name
        folder.mkdir(parents=True, exist_ok=True)
        print(f"=== {name}", flush=True)
        if probe is secrets_scan:
            result = probe.run(folder, args.quick, rng, roots=[work])
        else:
            result = probe.run(folder, args.quick, rng)
        print(f"{'met' if result.passed else 'NOT MET'}: {result.figures}", flush=True)
        results.append(result)
    mode = "quick" if args.quick else "full"
    report = {
        "mode": mode,
        "command": "python tools/reliability/run.py" + (" --quick" if args.quick else ""),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "seed": args.seed,
        "machine": start,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "work": str(work),
        "passed": all(r.passed for r in results),
        "probes": [r.__dict__ for r in results],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "reliability" if mode == "full" else "reliability-quick"
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (args.out / f"{stem}.md").write_text(markdown(report))
    print(markdown(report))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
