"""Plain-data views of a config and secret redaction."""

from __future__ import annotations

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


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return None  # a programmatic object (data.dataset = Dataset) has no YAML form


def dump_yaml(tree: dict[str, Any]) -> str:
    """Return YAML text for a to_dict tree, sections in declaration order."""
    return yaml.safe_dump(_plain(tree), sort_keys=False, default_flow_style=False)
