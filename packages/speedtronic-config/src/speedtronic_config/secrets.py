"""Which settings hold secrets, so no message, log line or saved file ever shows their values."""

from __future__ import annotations

import re

# section -> secret field names; hub: and diloco: are spellings of the distributed section.
SECRET_FIELDS = {"distributed": ("token",)}
SECTION_SPELLINGS = {"distributed": ("distributed", "hub", "diloco")}
_NAME = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)")


def is_secret_path(path: str) -> bool:
    """Return True when a dotted path (or the text of a malformed override) names a secret field,
    or a section value that may hold one.
    """
    root, _, rest = path.partition(".")
    root_name, field = _NAME.match(root), _NAME.match(rest)
    for section, names in SECRET_FIELDS.items():
        if root_name is None or root_name[1] not in SECTION_SPELLINGS.get(section, (section,)):
            continue
        # The section itself (a whole mapping or a stray scalar) may carry the secret too.
        return field is None or field[1] in names
    return False


def describe_hidden(value: object) -> str:
    """Return what may be said about a secret value: its type, never its content."""
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}, value hidden"


__all__ = ["SECRET_FIELDS", "describe_hidden", "is_secret_path"]
