"""Read a configuration mapping from a YAML/JSON file or inline text, with located parse errors."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from speedtronic_config.errors import ConfigError


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping: PyYAML keeps the last one,
    so an edit further down a long config silently replaced the setting above it.
    """


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[str] = set()
    for key_node, _ in node.value:
        # Scalar keys only: `<<` merges a mapping in, where keys may repeat by design.
        if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
            if key_node.value in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key_node.value!r}: keep one", key_node.start_mark
                )
            seen.add(key_node.value)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def parse_text(text: str, source: str, *, as_json: bool = False) -> Any:
    """Return the data in YAML (or JSON) text; a syntax error names the source, line and column."""
    if as_json:
        try:
            return json.loads(text)
        except json.JSONDecodeError as error:
            raise ConfigError(
                source, f"invalid JSON at line {error.lineno}, column {error.colno}: {error.msg}"
            ) from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as error:
        raise ConfigError(source, describe_yaml_error(error)) from None


def describe_yaml_error(error: yaml.YAMLError, what: str = "invalid YAML") -> str:
    """Return a YAML error as one line, `<what> at line L, column C: problem`, without the quoted
    source text PyYAML adds (it spans several lines and may hold a secret).
    """
    if isinstance(error, yaml.MarkedYAMLError):
        mark = error.problem_mark or error.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return f"{what}{where}: {error.problem or error.context}"
    first = str(error).strip().splitlines()
    return f"{what}: {first[0] if first else type(error).__name__}"


def read_file(path: str | os.PathLike[str]) -> Any:
    """Return the data in a .yaml/.yml/.json file; a missing or unreadable file is a ConfigError."""
    file = Path(path)
    if not file.exists():
        raise ConfigError(str(file), "config file not found", allowed="check the path")
    if file.is_dir():
        raise ConfigError(str(file), "is a directory, not a config file")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(
            str(file), f"is not UTF-8 text ({error.reason} at byte {error.start})"
        ) from None
    except OSError as error:
        raise ConfigError(str(file), f"cannot be read: {error.strerror or error}") from None
    return parse_text(text, str(file), as_json=file.suffix.lower() == ".json")


def read_source(source: str | os.PathLike[str] | Mapping[str, Any]) -> Any:
    """Return the data of a mapping, a path, or inline YAML/JSON text (told apart heuristically)."""
    if isinstance(source, Mapping):
        return source
    if isinstance(source, os.PathLike):
        return read_file(source)
    if not isinstance(source, str):
        raise ConfigError(
            "",
            f"cannot load a config from {type(source).__name__}",
            allowed="pass a mapping, a file path or YAML/JSON text",
        )
    # Multi-line text or a JSON object is inline; a single line is a path if such a file exists,
    # else inline text when it parses to a mapping, else a path that is missing.
    if "\n" in source or source.lstrip().startswith("{"):
        return parse_text(source, "<inline config>")
    if Path(source).exists():
        return read_file(source)
    try:
        inline = parse_text(source, "<inline config>")
    except ConfigError:
        if ": " in source:  # meant as inline YAML: report the syntax error, not a missing file
            raise
        inline = None
    if isinstance(inline, Mapping):
        return inline
    if isinstance(inline, list):  # no file of that name: YAML that is not a config
        raise ConfigError(
            "<inline config>", "must be a mapping, not a list", allowed="e.g. 'model: {n_layer: 6}'"
        )
    return read_file(source)
