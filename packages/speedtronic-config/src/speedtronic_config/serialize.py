"""Plain-data views of a config and secret redaction."""

from __future__ import annotations

import os
from dataclasses import fields
from typing import Any

import yaml

from speedtronic_config.secrets import SECRET_FIELDS


def section_dict(section: Any) -> dict[str, Any]:
    """Return a section's fields as plain data (tuples become lists)."""
    out: dict[str, Any] = {}
    for spec in fields(section):
        value = getattr(section, spec.name)
        out[spec.name] = list(value) if isinstance(value, (tuple, list)) else value
    return out


def redact(tree: dict[str, Any]) -> dict[str, Any]:
    """Blank every secret field in a to_dict tree in place and return it."""
    for section, names in SECRET_FIELDS.items():
        for name in names:
            if tree.get(section, {}).get(name) is not None:
                # null, not a placeholder: a saved file reloads without a bogus token (SDK env auth
                # applies).
                tree[section][name] = None
    return tree


def plain_data(value: Any) -> Any:
    """Return a to_dict tree (or one field) as YAML-safe data, path objects as strings.

    Any other object (data.dataset = a Dataset) becomes None: it has no saved form.
    """
    if isinstance(value, dict):
        return {key: plain_data(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_data(item) for item in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return None


def dump_yaml(tree: dict[str, Any]) -> str:
    """Return YAML text for a to_dict tree, sections in declaration order."""
    return yaml.safe_dump(plain_data(tree), sort_keys=False, default_flow_style=False)
