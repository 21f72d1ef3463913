"""Run each package's tests in a fresh environment holding only that package and its declared deps.

Every package's wheel is built; each package then gets a new venv with its wheel, its sibling
wheels (resolved from the local wheelhouse, never PyPI) and its `[dependency-groups] test` list.
torch is never installed per package: a venv whose dependency closure needs torch gets a `.pth`
file pointing at one shared `pip install --target` copy. An undeclared import fails here.

Usage: python tools/isolated_tests.py [PACKAGE ...]
"""

from __future__ import annotations

import re
import subprocess
import sys
import venv
from pathlib import Path

from dependency_contract import normalize

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".ci-cache"
TORCH = "torch==2.13.0"
SUMMARY = re.compile(r"(\d+) (passed|failed|error|errors|skipped)")


def project(package: Path) -> dict:
    return tomllib.loads((package / "pyproject.toml").read_text())


def run(*cmd: str | Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], check=True, **kwargs)


def shared_torch() -> Path:
    """Return a folder holding one torch install, installing it on first use."""
    target = CACHE / "torch-site"
    if not (target / "torch" / "__init__.py").exists():
        print(f"installing {TORCH} once into {target}", flush=True)
        run(sys.executable, "-m", "pip", "install", "-q", "--target", target, TORCH)
    return target


def build_wheels(packages: list[Path]) -> Path:
    wheelhouse = CACHE / "wheelhouse"
    wheelhouse.mkdir(parents=True, exist_ok=True)
    for old in wheelhouse.glob("*.whl"):
        old.unlink()
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheelhouse, *packages)
    return wheelhouse


def closure(name: str, packages: dict[str, Path]) -> set[str]:
    """Return `name` and every distribution it needs, directly or through its siblings."""
    deps = {normalize(d) for d in project(packages[name])["project"].get("dependencies", [])}
    result = {name} | deps
    for dep in deps & packages.keys():
        result |= closure(dep, packages)
    return result


def test_package(
    name: str, packages: dict[str, Path], wheelhouse: Path
) -> tuple[int, dict[str, int], list[str]]:
    env_dir = CACHE / "envs" / name
    venv.EnvBuilder(clear=True, with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    needed = closure(name, packages)
    if "torch" in needed:
        site = run(
            python,
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            capture_output=True,
            text=True,
        ).stdout.strip()
        Path(site, "shared-torch.pth").write_text(f"{shared_torch()}\n")
    # Local wheels by path: PyPI also has a `speedtronic`, which must never be picked instead.
    wheels = [
        next(wheelhouse.glob(f"{dist.replace('-', '_')}-*.whl"))
        for dist in sorted(needed & packages.keys())
    ]
    test_deps = project(packages[name]).get("dependency-groups", {}).get("test", [])
    run(python, "-m", "pip", "install", "-q", *wheels, *test_deps)
    tests = ROOT / "tests" / name
    if not any(tests.glob("test_*.py")):
        print(f"[{name}] no tests", flush=True)
        return 0, {}, []
    proc = subprocess.run(
        [str(python), "-m", "pytest", str(tests)], cwd=CACHE, capture_output=True, text=True
    )
    print(proc.stdout[-4000:], proc.stderr[-2000:], sep="", flush=True)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    counts = {kind.rstrip("s"): int(n) for n, kind in SUMMARY.findall(last)}
    # pytest's short summary lines, repeated at the very end where a CI log's tail shows them.
    failures = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    return proc.returncode, counts, failures


def main(argv: list[str]) -> int:
    packages = {
        p.name: p for p in sorted((ROOT / "packages").iterdir()) if (p / "pyproject.toml").exists()
    }
    selected = argv[1:] or list(packages)
    CACHE.mkdir(exist_ok=True)
    (CACHE / "pytest.ini").write_text(
        "[pytest]\naddopts = -q --import-mode=importlib -p no:cacheprovider\n"
    )
    wheelhouse = build_wheels(list(packages.values()))
    totals = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    failed: list[str] = []
    failures: list[str] = []
    for name in selected:
        print(f"=== {name}: isolated environment ===", flush=True)
        code, counts, package_failures = test_package(name, packages, wheelhouse)
        for kind, n in counts.items():
            totals[kind] = totals.get(kind, 0) + n
        if code not in (0, 5):
            failed.append(name)
            failures += [f"[{name}] {line}" for line in package_failures]
    if failures:
        print(*failures, sep="\n")
    print(
        f"isolated packages: {len(selected) - len(failed)}/{len(selected)} green"
        + (f"; failing: {', '.join(failed)}" if failed else "")
    )
    print(
        f"isolated: {totals['passed']} passed, {totals['failed'] + totals['error']} failed, "
        f"{totals['skipped']} skipped"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
