"""Check the package graph: every package declares and imports only what tools/package_graph.toml
allows.

Usage: python tools/dependency_contract.py [REPO_ROOT]   (exit 0 when the graph holds, 1 otherwise)
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

GRAPH_FILE = Path("tools") / "package_graph.toml"


@dataclass(frozen=True)
class Rule:
    name: str
    internal: frozenset[str]
    external: frozenset[str]


def load_graph(root: Path) -> tuple[list[Rule], dict[str, str]]:
    """Return the package rules in dependency order and the import-name -> distribution map."""
    data = tomllib.loads((root / GRAPH_FILE).read_text())
    rules = [
        Rule(p["name"], frozenset(p.get("internal", [])), frozenset(p.get("external", [])))
        for p in data["package"]
    ]
    return rules, dict(data.get("import_names", {}))


def normalize(requirement: str) -> str:
    """Return the distribution name of a PEP 508 requirement string, normalized."""
    name = re.split(r"[\s<>=!~;\[(@]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_dependencies(package_dir: Path) -> set[str]:
    """Return every distribution the package declares, required or optional."""
    project = tomllib.loads((package_dir / "pyproject.toml").read_text())["project"]
    names = {normalize(r) for r in project.get("dependencies", [])}
    for extra in project.get("optional-dependencies", {}).values():
        names |= {normalize(r) for r in extra}
    return names


def imported_modules(source_dir: Path) -> dict[str, str]:
    """Return top-level absolute imports found under source_dir, each with one place it occurs."""
    found: dict[str, str] = {}
    for path in sorted(source_dir.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], f"{path}:{node.lineno}")
    return found


def check(root: Path) -> list[str]:
    """Return one message per violation of the package graph under root."""
    rules, import_names = load_graph(root)
    errors: list[str] = []
    order = [rule.name for rule in rules]
    for index, rule in enumerate(rules):
        for dep in sorted(rule.internal):
            if dep not in order[:index]:
                errors.append(
                    f"{GRAPH_FILE}: {rule.name} may not depend on {dep} (against the graph "
                    "direction)"
                )
    known = {rule.name: rule for rule in rules}
    packages_dir = root / "packages"
    for package_dir in sorted(p for p in packages_dir.iterdir() if (p / "pyproject.toml").exists()):
        name = package_dir.name
        rule = known.get(name)
        if rule is None:
            errors.append(f"{package_dir}: package not listed in {GRAPH_FILE}")
            continue
        declared = declared_dependencies(package_dir)
        allowed = rule.internal | rule.external
        for dep in sorted(declared - allowed):
            errors.append(
                f"{package_dir}/pyproject.toml: {name} declares {dep}, which the graph does not "
                "allow"
            )
        own = name.replace("-", "_")
        imports = imported_modules(package_dir / "src")
        for dep in sorted(rule.internal):
            # The graph allows only the edges the code needs: an unused one is an error too.
            if dep.replace("-", "_") not in imports:
                errors.append(
                    f"{GRAPH_FILE}: {name} may depend on {dep} but never imports it; remove the "
                    "edge (and the declared dependency)"
                )
        for module, where in sorted(imports.items()):
            if module == own or module in sys.stdlib_module_names or module == "__future__":
                continue
            dist = import_names.get(module, module.replace("_", "-")).lower()
            if dist not in declared:
                errors.append(f"{where}: {name} imports {module} but does not declare {dist}")
    return errors


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    errors = check(root)
    for error in errors:
        print(error)
    count = sum(1 for p in (root / "packages").iterdir() if (p / "pyproject.toml").exists())
    print(f"dependency contract: {count} packages, {len(errors)} violations")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
