"""Each package README's Python example runs as written, in a fresh process and folder; the
repository README's and docs/'s snippets hold as far as they run alone.

A package README is the page a user of that package alone reads first; its example is copied,
not read, so a setting default or a renamed argument must fail here before it fails there.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)
# Examples that need what a test machine has not: their reason.
NEEDS = {"speedtronic-diloco": "a Hugging Face Hub repository it can write to"}
READMES = sorted((ROOT / "packages").glob("*/README.md"))


def test_every_package_readme_is_checked_or_says_why_not():
    names = {path.parent.name for path in READMES}
    assert set(NEEDS) <= names
    assert all(BLOCK.search(path.read_text(encoding="utf-8")) for path in READMES)


@pytest.mark.parametrize("readme", READMES, ids=lambda path: path.parent.name)
def test_package_readme_example_runs(readme, tmp_path):
    if readme.parent.name in NEEDS:
        pytest.skip(f"the example needs {NEEDS[readme.parent.name]}")
    # A README's blocks are one session: a later block may use what an earlier one wrote.
    code = "\n".join(BLOCK.findall(readme.read_text(encoding="utf-8")))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "error::DeprecationWarning"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{readme.relative_to(ROOT)}:\n{done.stderr[-3000:]}"


# The repository README and the guides under docs/ (the generated inventory aside): their snippets
# need a run's files (a checkpoint, shards, a Hub), so here each is checked as far as it runs alone.
DOCS = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "source-inventory.md"),
]


def _doc_blocks(language: str) -> list[tuple[str, str]]:
    """Return (file:line, text) of every ```language block in the docs."""
    fence = re.compile(rf"^```{language}\n(.*?)^```$", re.DOTALL | re.MULTILINE)
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for match in fence.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{path.relative_to(ROOT)}:{line}", match[1]))
    return found


def _cli_arguments(command: str) -> list[str] | None:
    """Return the speedtronic arguments of one shell command, or None when it runs something else.

    `hatch run SCRIPT ARGS` becomes the speedtronic command of that hatch.toml script, and a
    documentation placeholder (`...`, `[--flag]` for an optional one) is read as the flag alone.
    """
    import shlex

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]

    words = [w.strip("[]") for w in shlex.split(command, comments=True) if w not in ("&", "...")]
    if words[:2] == ["hatch", "run"]:
        scripts = tomllib.loads((ROOT / "hatch.toml").read_text())["envs"]["default"]["scripts"]
        script = scripts.get(words[2])
        if words[2] != "speedtronic" and script is None:
            return None
        if script is not None:
            script = script[-1] if isinstance(script, list) else script
            if "speedtronic" not in script.split():
                return None
            words = [*shlex.split(script.replace("{args}", "")), *words[3:]]
        else:
            words = words[2:]
    if "speedtronic" not in words or "=" in words[0]:
        return None
    return words[words.index("speedtronic") + 1 :]


def _doc_commands() -> list[tuple[str, str]]:
    commands = []
    for where, text in _doc_blocks("bash"):
        for line in text.replace("\\\n", " ").splitlines():
            for command in re.split(r"&&|;|\|", line):
                if _cli_arguments(command) is not None:
                    commands.append((where, command.strip()))
    return commands


@pytest.mark.parametrize(("where", "text"), _doc_blocks("yaml"), ids=lambda x: x)
def test_docs_yaml_snippet_is_a_valid_config(where, text):
    from speedtronic_config import SpeedtronicConfig

    SpeedtronicConfig.load(text)  # a ConfigError names the key that is wrong


@pytest.mark.parametrize(("where", "command"), _doc_commands(), ids=lambda x: x)
def test_docs_cli_command_has_the_arguments_the_cli_takes(where, command, capsys):
    from speedtronic.cli import _cuda_overrides, _load_config, _parser

    parser, words = _parser(), _cli_arguments(command)
    try:
        args = parser.parse_args(words)
    except SystemExit as stop:  # a renamed flag or command: argparse's one line and exit 2
        pytest.fail(f"{where}: {command}\n{capsys.readouterr().err}exit {stop.code}")
    # argparse also takes a flag's prefix (--val-frac), which a reader would copy as a name.
    flags = parser.commands[args.command]._option_string_actions
    assert [w for w in words if w.startswith("--") and w.split("=")[0] not in flags] == [], where
    if args.command in ("train", "validate"):
        # Its --set keys and values hold on the shipped config it names (a placeholder such as
        # CONFIG: on the defaults); a ConfigError names the one that does not.
        config = ROOT / args.config
        overlay = getattr(args, "cuda_overlay", None)
        overlay = _cuda_overrides(str(ROOT / overlay)) if overlay else []
        _load_config(str(config) if config.is_file() else {}, [*overlay, *args.overrides])


@pytest.mark.parametrize(("where", "text"), _doc_blocks("python"), ids=lambda x: x)
def test_docs_python_snippet_compiles_and_its_imports_exist(where, text):
    import ast

    tree = ast.parse(text, filename=where)
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    if any(node.module == "transformers" for node in imports if isinstance(node, ast.ImportFrom)):
        pytest.importorskip("transformers")
    exec(compile(ast.Module(body=imports, type_ignores=[]), where, "exec"), {})


def test_docs_have_snippets_each_check_reads():
    # A fence the patterns miss (```sh, an indented one) would silently check nothing.
    assert len(_doc_blocks("yaml")) >= 3 and len(_doc_blocks("python")) >= 7
    assert len(_doc_commands()) >= 20


def _name_lists() -> list[tuple[str, set[str], set[str]]]:
    """Return (file:line, backticked names, names of its whole table) of each paragraph and table
    row of the docs and package READMEs (a paragraph is its own table).
    """
    found = []
    for path in [*DOCS, *READMES]:
        line = 1
        for block in path.read_text(encoding="utf-8").split("\n\n"):
            rows = block.splitlines() if block.lstrip().startswith("|") else [block]
            table = set(re.findall(r"`([\w.]+)`", block))
            for offset, row in enumerate(rows):
                names = set(re.findall(r"`([\w.]+)`", row))
                found.append((f"{path.relative_to(ROOT)}:{line + offset}", names, table))
            line += block.count("\n") + 2
    return found


def test_docs_that_list_a_set_of_names_list_all_of_it():
    # A list written out by hand goes stale when the set grows: the config sections lacked
    # `parallel`, and the model settings a resume may change lacked `loss_chunk_size` in two pages.
    from speedtronic_config.normalize import SECTIONS
    from speedtronic_config.sections import ModelConfig

    sets = {"the config sections": set(SECTIONS), "ModelConfig.RESUMABLE": ModelConfig.RESUMABLE}
    wrong = []
    for where, names, table in _name_lists():
        for label, members in sets.items():
            named = names & members
            # Most of a set named at once is a list of it; a table row may leave a member to
            # another row of its table.
            if len(named) >= max(4, len(members) - 3) and not members <= table:
                wrong.append(f"{where}: lists {label} without {sorted(members - named)}")
    assert wrong == []


def _reference_tables() -> dict[str, dict[str, tuple[str, str]]]:
    """Return {heading: {key: (default, rule)}} from docs/configuration.md's tables: a row names
    its keys in the first cell (`a`, `b` or `a` / `b`), their defaults in the third, one per key or
    one for all, and their rule in the fourth.
    """
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    tables: dict[str, dict[str, tuple[str, str]]] = {}
    for part in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        heading, body = part.split("\n", 1)
        rows = tables.setdefault(heading.split()[0], {})
        for line in body.splitlines():
            cells = [c.strip() for c in line.replace("\\|", "¦").strip("|").split("|")]
            if not line.startswith("| `") or len(cells) < 3:
                continue
            keys, defaults = re.findall(r"`([^`]+)`", cells[0]), re.findall(r"`([^`]+)`", cells[2])
            rule = cells[3] if len(cells) > 3 else ""
            for index, key in enumerate(keys):
                default = defaults[index if len(defaults) == len(keys) else 0] if defaults else ""
                rows[key] = (default, rule)
    return tables


# A rule cell that opens with a range: `> 0`, `≥ 1`, `[0, 1)`, `(0, 1]`, `in [0, 2**32)`.
_BOUND = re.compile(r"(?:in )?(?P<op>[>≥]) ?(?P<at>[\d.]+)")
_INTERVAL = re.compile(r"(?:in )?(?P<lo_in>[\[(])(?P<lo>[\d.]+), (?P<hi>[\d.*]+)(?P<hi_in>[\])])")
# What a field's bounds are checked alongside, where another field limits it.
_RANGE_CONTEXT = {
    "model": {"n_head": 1, "n_kv_head": 1},  # d_model must divide by n_head
    "optimizer": {"name": "muon"},  # adamw_lr needs muon
    "distributed": {"retry_initial": 1e-9},  # retry_max must be at least retry_initial
}


def _range_probes(rule: str, integer: bool) -> list[tuple[float, bool]]:
    """Return (value, documented as valid) at the edges of the range a rule cell opens with."""
    step = 1 if integer else 1e-6
    if match := _BOUND.match(rule):
        at = float(match["at"])
        return [(at, match["op"] == "≥"), (at - step, False), (at + step, True)]
    if match := _INTERVAL.match(rule):
        low, high = float(match["lo"]), float(eval(match["hi"]))  # noqa: S307 - a doc's 2**32
        return [
            (low, match["lo_in"] == "["),
            (low - step, False),
            (high, match["hi_in"] == "]"),
            (high + step, False),
        ]
    return []


def test_configuration_reference_lists_every_key_with_its_default():
    import dataclasses

    import yaml

    from speedtronic_config import ConfigError, SpeedtronicConfig
    from speedtronic_config.normalize import ROOT_FLAGS, SECTIONS

    def value(text: str):
        parsed = yaml.safe_load(text)
        try:  # PyYAML reads 1e-8 as text
            return float(parsed) if isinstance(parsed, str) else parsed
        except ValueError:
            return parsed

    tables = _reference_tables()
    wrong = []
    for name, cls in [*SECTIONS.items(), ("Root", SpeedtronicConfig)]:
        rows = tables.get(name, {})
        specs = [s for s in dataclasses.fields(cls) if name != "Root" or s.name in ROOT_FLAGS]
        for spec in specs:
            default = spec.default
            if default is dataclasses.MISSING:
                default = spec.default_factory()
            default = list(default) if isinstance(default, tuple) else default
            where = f"{name}.{spec.name}"
            if spec.name not in rows:
                wrong.append(f"{where}: not documented (default {default!r})")
                continue
            documented, rule = rows[spec.name]
            if value(documented) != default:
                wrong.append(f"{where}: documented {documented}, is {default!r}")
            integer = str(spec.type).startswith("int")
            for probe, valid in _range_probes(rule, integer) if name != "Root" else []:
                probe = int(probe) if integer else probe
                values = {name: {**_RANGE_CONTEXT.get(name, {}), spec.name: probe}}
                try:
                    SpeedtronicConfig.from_dict(values)
                    accepted = True
                except ConfigError:
                    accepted = False
                if accepted != valid:
                    verb = "accepts" if accepted else "refuses"
                    wrong.append(
                        f"{where}: documented {rule.split(';')[0]!r}, the code {verb} {probe}"
                    )
        if name != "Root":
            known = {spec.name for spec in specs}
            wrong += [f"{name}.{key}: documented, no such field" for key in rows.keys() - known]
    assert set(SECTIONS) <= set(tables["Root"]), "the Root table lists every section"
    assert wrong == []
