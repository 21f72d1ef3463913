"""Extract the 2.0 public API (modules, names, signatures) from the 2.0 source-inventory page.

Run once against the 2.0 documentation's generated source inventory; the JSON it writes is
committed as tests/speedtronic/spec_api_2_0.json, so the 2.0 surface is pinned in the repository:

    python tools/extract_spec_api.py INVENTORY.txt tests/speedtronic/spec_api_2_0.json
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from pathlib import Path

_MODULE = re.compile(r"^src/(speedtronic/.+)\.py$")
_KINDS = ("posonlyargs", "args", "kwonlyargs")


def _signature(line: str) -> dict | None:
    """Return {name, params: [[name, kind, default-source or None]]} for a `def` line."""
    text = line.replace("\\|", "|").strip()
    try:
        tree = ast.parse(text + ": pass")
    except SyntaxError:
        return None
    node = tree.body[0]
    args = node.args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params = []
    for index, arg in enumerate(positional):
        kind = "positional_only" if index < len(args.posonlyargs) else "positional_or_keyword"
        default = defaults[index]
        params.append([arg.arg, kind, None if default is None else ast.unparse(default)])
    if args.vararg:
        params.append([args.vararg.arg, "var_positional", None])
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        params.append([arg.arg, "keyword_only", None if default is None else ast.unparse(default)])
    if args.kwarg:
        params.append([args.kwarg.arg, "var_keyword", None])
    return {"name": node.name, "params": params}


def raw_is_package(module: dict) -> bool:
    """Return whether the module entry is a package's __init__."""
    return module.get("package", False)


def extract(text: str) -> dict:
    """Return {module: {"classes": {name: {method: signature}}, "fields": {class: [field, ...]},
    "functions": ..., "names": ...}}; a dataclass's fields are listed in declaration order.
    """
    modules: dict[str, dict] = {}
    current = None
    kind = None  # "class" or "function" for the latest heading
    owner = None
    for raw in text.splitlines():
        line = raw.strip()
        match = _MODULE.match(line)
        if match:
            path = match.group(1).replace("/", ".").removesuffix(".__init__")
            current = modules.setdefault(
                path, {"classes": {}, "fields": {}, "functions": {}, "names": []}
            )
            current["package"] = match.group(1).endswith("__init__")
            owner = None
            continue
        if current is None:
            continue
        if line.startswith("Test modules"):
            break
        if line.startswith("Imported modules:") and raw_is_package(current):
            # A package's relative imports are the names it hands out (`.config.Config` -> Config).
            names = [item.strip() for item in line.split(":", 1)[1].split(",")]
            current["names"] += [n.rsplit(".", 1)[1] for n in names if n.startswith(".")]
        if line.startswith("Class ") and line != "Class attributes and fields":
            owner = line.split()[1]
            if not owner.startswith("_"):
                current["classes"].setdefault(owner, {})
            kind = "class"
        elif line.startswith("Function "):
            owner, kind = None, "function"
        elif line.startswith("Method "):
            kind = "method"
        elif line.startswith("def ") and kind in ("function", "method"):
            sig = _signature(line)
            if sig is None:
                continue
            name = sig.pop("name")
            public = not name.startswith("_") or name == "__init__"
            if kind == "function" and not name.startswith("_"):
                current["functions"][name] = sig
            elif kind == "method" and owner and not owner.startswith("_") and public:
                current["classes"][owner][name] = sig
        elif line == "Class attributes and fields":
            kind = "fields"
        elif line.startswith("field\t") and kind == "fields" and not owner.startswith("_"):
            current["fields"].setdefault(owner, []).append(line.split("\t")[1])
        elif line.startswith("constant/alias"):
            name = line.split("\t")[1]
            if not name.startswith("_") and name != "T":
                current["names"].append(name)
    for module in modules.values():
        module.pop("package")
        module["names"] = sorted(set(module["names"]))
    return modules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inventory", type=Path)
    parser.add_argument("output", type=Path)
    args = parser.parse_args()
    api = extract(args.inventory.read_text(encoding="utf-8"))
    args.output.write_text(json.dumps(api, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    count = sum(len(m["functions"]) + sum(map(len, m["classes"].values())) for m in api.values())
    print(f"wrote {args.output}: {len(api)} modules, {count} signatures")


if __name__ == "__main__":
    main()
