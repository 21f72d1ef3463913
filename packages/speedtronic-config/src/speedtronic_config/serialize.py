"""Plain-data views of a config, secret redaction and atomic YAML files."""

from __future__ import annotations

import os
import tempfile
from dataclasses import fields
from pathlib import Path
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


def write_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write `text` to `path` so readers see the old file or the whole new one, never a torn one."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temp, 0o666 & ~umask)  # mkstemp makes 0600; give the file ordinary permissions
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return target
