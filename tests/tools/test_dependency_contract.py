"""The dependency check passes on the repository and fails on planted violations."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "dependency_contract.py"


def copy_repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "tools", root / "tools")
    shutil.copytree(
        ROOT / "packages", root / "packages", ignore=shutil.ignore_patterns("__pycache__")
    )
    return root


def run_check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), str(root)], capture_output=True, text=True)


def test_repository_holds_the_graph():
    result = run_check(ROOT)
    assert result.returncode == 0, result.stdout
    assert "0 violations" in result.stdout


def test_undeclared_import_fails(tmp_path):
    root = copy_repo(tmp_path)
    module = root / "packages" / "speedtronic-config" / "src" / "speedtronic_config" / "planted.py"
    module.write_text("import torch\n")
    result = run_check(root)
    assert result.returncode == 1
    assert (
        "planted.py:1: speedtronic-config imports torch but does not declare torch" in result.stdout
    )


def test_declaring_a_dependency_against_the_graph_fails(tmp_path):
    root = copy_repo(tmp_path)
    pyproject = root / "packages" / "speedtronic-config" / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"pyyaml>=6.0"', '"pyyaml>=6.0", "numpy"'))
    result = run_check(root)
    assert result.returncode == 1
    assert "speedtronic-config declares numpy, which the graph does not allow" in result.stdout


def test_graph_edge_against_the_direction_fails(tmp_path):
    root = copy_repo(tmp_path)
    graph = root / "tools" / "package_graph.toml"
    text = graph.read_text().replace(
        'name = "speedtronic-config"\ninternal = []',
        'name = "speedtronic-config"\ninternal = ["speedtronic-trainer"]',
    )
    graph.write_text(text)
    result = run_check(root)
    assert result.returncode == 1
    assert (
        "speedtronic-config may not depend on speedtronic-trainer (against the graph direction)"
        in result.stdout
    )


def test_unlisted_package_fails(tmp_path):
    root = copy_repo(tmp_path)
    rogue = root / "packages" / "speedtronic-rogue"
    shutil.copytree(root / "packages" / "speedtronic-config", rogue)
    result = run_check(root)
    assert result.returncode == 1
    assert "speedtronic-rogue: package not listed" in result.stdout


def test_an_allowed_edge_the_code_never_uses_fails(tmp_path):
    root = copy_repo(tmp_path)
    graph = root / "tools" / "package_graph.toml"
    text = graph.read_text().replace(
        'name = "speedtronic-trainer"\ninternal = ["speedtronic-config", "speedtronic-systems"]',
        'name = "speedtronic-trainer"\n'
        'internal = ["speedtronic-config", "speedtronic-model", "speedtronic-systems"]',
    )
    assert text != graph.read_text()
    graph.write_text(text)
    result = run_check(root)
    assert result.returncode == 1
    expected = "speedtronic-trainer may depend on speedtronic-model but never imports it"
    assert expected in result.stdout
