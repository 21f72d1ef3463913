"""`--set key=value` overrides applied to a raw mapping before validation."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, fields
from typing import Any

import yaml

from speedtronic_config.errors import ConfigError
from speedtronic_config.loading import describe_yaml_error, parse_value
from speedtronic_config.normalize import (
    OPTIMIZER_ROOT_FIELDS,
    ROOT_KEYS,
    RUN_ALIASES,
    SECTION_ALIASES,
    SECTIONS,
    field_names,
    unknown_compile_key,
    unknown_field,
)
from speedtronic_config.secrets import is_secret_path

# A scalar given for these sections is their shorthand field (optimizer=muon, precision=bf16).
SHORTHAND_FIELD = {"optimizer": "name", "precision": "mode", "compile": "enabled"}
# One section's three spellings: distributed: and its 2.0 aliases.
_DISTRIBUTED_NAMES = ("distributed", *SECTION_ALIASES)
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def parse_override(text: str) -> tuple[list[str], Any]:
    """Return the dotted path and the YAML-scalar value of one `key=value` override."""
    key, sep, raw = text.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(parts):
        # Name the key only when it is one; echo the text only when it cannot hold a secret.
        where = key.strip() if _DOTTED.fullmatch(key.strip()) else "--set"
        shown = {} if is_secret_path(text) else {"value": text}
        raise ConfigError(
            where,
            "an override must look like section.key=value",
            allowed="e.g. model.n_layer=6",
            **shown,
        )
    if not raw.strip():
        # An empty value is most often an unset shell variable (--set data.shard_path=$SHARDS):
        # read as null it would silently fall back to the default, e.g. synthetic data.
        raise ConfigError(key.strip(), "empty value", allowed=_unset_hint(key.strip()))
    try:
        value = parse_value(raw, key.strip())
    except yaml.YAMLError as error:
        problem = describe_yaml_error(error, "value is not valid YAML", raw)
        # The loader's own refusals (octal, base 60, a bad date) already say when to quote.
        fix = (
            None
            if "quote it" in problem
            else f"quote a string value, e.g. --set '{key.strip()}=\"TEXT\"'"
        )
        raise ConfigError(key.strip(), problem, value=raw, allowed=fix) from None
    if _has_comment(raw):
        # YAML drops the rest of the line: `corpus #2.txt` was read as `corpus`, and `#2.txt` as
        # null, which falls back to the default as an empty value would.
        raise ConfigError(
            key.strip(),
            "the # starts a YAML comment, which would cut the value short",
            value=raw.strip(),
            # A list or mapping ([a] # b) would become a string if quoted whole: drop the comment.
            allowed=f"drop the comment, or quote a value that holds a #, e.g. --set "
            f"'{key.strip()}=\"a #1\"'",
        )
    return parts, value


def _has_comment(text: str) -> bool:
    """Return True when YAML text holds a comment: a # in the gap between two of its tokens."""
    if "#" not in text:
        return False
    end = 0
    for token in yaml.scan(text, Loader=yaml.SafeLoader):
        if "#" in text[end : token.start_mark.index]:
            return True
        end = token.end_mark.index
    return False


def _unset_hint(key: str) -> str:
    """Return the fix for an empty `key=`: null where the field takes it, else its default."""
    if key in RUN_ALIASES:
        key = f"run.{key}"
    section, _, name = key.partition(".")
    name = name or SHORTHAND_FIELD.get(section, "")
    spec = {f.name: f for f in fields(SECTIONS[section])}.get(name) if section in SECTIONS else None
    if spec is not None and str(spec.type).endswith("| None"):
        return f"write {key}=null to unset it"
    if spec is None or spec.default is MISSING:
        return "give it a value"
    return f"give it a value (its default is {override_value(spec.default)})"


def override_value(value: Any) -> str:
    """Return YAML text that parse_override reads back as `value` exactly, for building a
    `key=value` override from data. Not json.dumps: it refuses YAML's own types (a date, bytes),
    and escapes a character outside the BMP (an emoji in a path) as a surrogate pair, which PyYAML
    reads back as two lone surrogates that no file name can hold.
    """
    options = {"default_flow_style": True, "allow_unicode": True, "width": float("inf")}
    text = yaml.safe_dump(value, **options)
    if "\x85" in text:
        # PyYAML writes a NEL raw in a quoted string and reads it back as a space: escape it.
        text = yaml.safe_dump(value, default_style='"', **options)
    return text.removesuffix("\n...\n").rstrip("\n")


def _target(tree: dict[str, Any], parts: list[str]) -> tuple[str, str | None]:
    """Return (root key, field) after checking the path against the schema."""
    root = parts[0]
    if root not in ROOT_KEYS:
        raise unknown_field("", root, ROOT_KEYS)
    nested = root in SECTIONS or root in SECTION_ALIASES or root == "compile"
    depth = 2 if nested else 1
    if len(parts) > depth:
        field = ".".join(parts[:depth])
        raise ConfigError(
            ".".join(parts), f"{field} is not a mapping", allowed=f"set it whole: {field}=VALUE"
        )
    if root in _DISTRIBUTED_NAMES:
        # Write into the spelling the config already uses (distributed:, hub: or diloco:), so the
        # override never conflicts with the section it changes.
        root = next((name for name in _DISTRIBUTED_NAMES if name in tree), root)
    if len(parts) == 1:
        if root in OPTIMIZER_ROOT_FIELDS:
            # Written into the section, so it replaces the field in either place the file sets it
            # (canonical refuses the two forms when they differ).
            return "optimizer", root
        return root, None
    if root == "compile":
        if parts[1] != "enabled":
            raise unknown_compile_key(parts[1])
    elif parts[1] not in (valid := field_names(SECTIONS.get(root, SECTIONS["distributed"]))):
        raise unknown_field(parts[0], parts[1], valid)  # as written, not the spelling used
    return root, parts[1]


def _set(tree: dict[str, Any], root: str, name: str | None, value: Any) -> None:
    if (
        name is None
        and root in SHORTHAND_FIELD
        and isinstance(tree.get(root), Mapping)
        and not isinstance(value, Mapping)
        and value is not None  # null resets the whole section, as for every other one
    ):
        name = SHORTHAND_FIELD[root]  # keep the section's other fields
    current = _fields(root, tree.get(root))
    if name is not None and current is None:
        raise ConfigError(
            root, "cannot set a field: the current value is not a mapping", value=tree[root]
        )
    given = {name: value} if name is not None else value
    if isinstance(given, Mapping) and current is not None:
        # `--set model={n_layer: 6}` changes the fields it names, as model.n_layer=6 would;
        # replacing the section reset every other field to its default, silently.
        tree[root] = {**current, **given}
    else:
        tree[root] = given
    # A top-level alias would otherwise win over this override (run), or conflict with it
    # (optimizer's muon_plus, cautious).
    aliases = {"run": RUN_ALIASES, "optimizer": OPTIMIZER_ROOT_FIELDS}.get(root, ())
    if isinstance(given, Mapping):
        for alias in aliases:
            if alias in given:
                tree.pop(alias, None)


def _fields(root: str, section: Any) -> Mapping[str, Any] | None:
    """Return the fields a section's current value sets (a shorthand expanded); None when it is
    not a section at all.
    """
    if section is None:
        return {}
    if isinstance(section, str) and root in SHORTHAND_FIELD:
        return {SHORTHAND_FIELD[root]: section}
    if isinstance(section, bool) and root == "compile":
        return {"enabled": section}
    return section if isinstance(section, Mapping) else None


def apply_overrides(values: Mapping[str, Any] | None, overrides: Iterable[str]) -> dict[str, Any]:
    """Return a new mapping with each `dotted.path=value` applied (values parsed as YAML
    scalars).
    """
    if values is not None and not isinstance(values, Mapping):
        raise ConfigError("", "the configuration root must be a mapping", value=values)
    tree: dict[str, Any] = copy.deepcopy(dict(values or {}))
    for text in overrides:
        parts, value = parse_override(text)
        root, name = _target(tree, parts)
        _set(tree, root, name, value)
    return tree
