"""Check and convert one field value against its annotation, so YAML and Python inputs agree."""

from __future__ import annotations

import datetime
import math
import re
from dataclasses import fields
from typing import Any

from speedtronic_config.errors import YAML_BOOLEANS, ConfigError

# Every integer setting's bound is below this: a float past it is no longer an exact integer.
INT_LIMIT = 2**53
_UNDERFLOW = "below the smallest float (about 5e-324), reads as 0"


def _underflows(text: str, number: float) -> bool:
    """Return whether numeric ``text`` names a nonzero number that reads as ``number`` 0.0."""
    mantissa = re.split("[eE]", text)[0]
    return number == 0 and any(digit in mantissa for digit in "123456789")


def past_float_range(text: str, number: float) -> str | None:
    """Return why a number written as ``text`` cannot be read as the ``number`` it reads as,
    with the fix: past the float range (infinity, unless written as one) or nonzero below it (0).
    None for a number in range. The YAML and JSON loaders refuse such numbers where written.
    """
    if math.isinf(number) and "inf" not in text.lower():
        return (
            "a number past the float range (about 1.8e308), reads as infinity; write a smaller "
            "number"
        )
    if _underflows(text, number):
        return f"a number {_UNDERFLOW}; write 0 or a larger number"
    return None


def _bool(value: Any, path: str) -> bool:
    if isinstance(value, bool):
        return value
    # 2.0 passed strings through bool(), so a quoted "false" became true; read it as the boolean
    # instead.
    if isinstance(value, str) and value.strip().lower() in {"true", "false"}:
        return value.strip().lower() == "true"
    raise ConfigError(
        path, "expected a boolean", value=value, allowed="use true or false (unquoted)"
    )


def _int(value: Any, path: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(path, "expected an integer, not a boolean", value=value)
    if isinstance(value, int):
        return value
    number = value if isinstance(value, float) else math.nan
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
        # PyYAML reads `1e6` (no dot) as a string, as it does `1e-8`; it is as whole a number as
        # `1.0e6`, which it reads as a float.
        try:
            number = float(value.strip())
        except ValueError:
            pass
    if math.isfinite(number) and number.is_integer():
        if abs(number) >= INT_LIMIT:  # else the range error shows 1e30 as 31 digits
            raise ConfigError(
                path,
                "is past the range of an integer setting",
                value=value,
                allowed="every integer setting is below 2**53",
            )
        return int(number)
    raise ConfigError(path, "expected an integer", value=value)


def _float(value: Any, path: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(path, "expected a number, not a boolean", value=value)
    number: float | None = None
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:  # an int past the float range: as non-finite as `1e400`
            number = None
    elif isinstance(value, str):
        # PyYAML reads `1e-8` (no dot) as a string; accept numeric text so such configs load.
        try:
            number = float(value.strip())
        except ValueError:
            number = None
        if number is not None and _underflows(value, number):  # else "must be positive (got 0.0)"
            raise ConfigError(path, _UNDERFLOW, value=value, allowed="write 0 or a larger number")
    if number is None or not math.isfinite(number):
        raise ConfigError(path, "expected a finite number", value=value)
    return number


def _str(value: Any, path: str) -> str:
    if isinstance(value, (list, tuple, dict)):  # quoting would not make one string of these
        kind = "a mapping" if isinstance(value, dict) else "a list"
        raise ConfigError(path, f"expected one string, not {kind}", value=value)
    if not isinstance(value, str):
        kind, why = _yaml_reading(value)
        raise ConfigError(path, f"expected a string, not {kind}", value=value, allowed=why)
    # No name, path, device or token may hold one: the OS refuses it in paths, often much later.
    if "\x00" in value:
        raise ConfigError(path, "must not contain a NUL character", value=value)
    return value


def _yaml_reading(value: Any) -> tuple[str, str]:
    """Return what YAML read a bare value as, and why quoting it gives the text: the value shown
    (False for `no`) is not what the user wrote.
    """
    if isinstance(value, bool):
        return "a boolean", f"quote it: {YAML_BOOLEANS}"
    if isinstance(value, datetime.date):  # a datetime is one too
        return "a date", "quote it: YAML reads a bare 2024-01-01 as a date"
    if isinstance(value, (int, float)):
        return "a number", "quote the value in YAML"
    return type(value).__name__, "quote the value in YAML"


def _str_list(value: Any, path: str) -> list[str]:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(
            path, "expected a list of strings", value=value, allowed="e.g. [a, b], or [] for none"
        )
    return [_str(item, f"{path}[{index}]") for index, item in enumerate(value)]


def _float_pair(value: Any, path: str) -> tuple[float, float]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ConfigError(
            path, "expected exactly two numbers", value=value, allowed="e.g. [0.9, 0.95]"
        )
    return (_float(value[0], f"{path}[0]"), _float(value[1], f"{path}[1]"))


def _int_or_str(value: Any, path: str) -> int | str:
    # "32", "1e1" or "32.0" (from YAML, a CLI or an env var), as an int field reads it; "08"
    # stays text, refused as in 2.0 (YAML 1.1 reads a leading 0 as octal).
    if not isinstance(value, str):
        return _int(value, path)
    if re.match(r"\s*[-+]?0[0-9]", value):
        return value
    try:
        return _int(value, path)
    except ConfigError:
        return value


_CONVERTERS = {
    "bool": _bool,
    "int": _int,
    "float": _float,
    "str": _str,
    "list[str]": _str_list,
    "tuple[float, float]": _float_pair,
    "int | str": _int_or_str,
}


def coerce(value: Any, annotation: str, path: str) -> Any:
    """Return `value` converted to the type named by `annotation`, or raise ConfigError."""
    if annotation == "Any":
        return value
    if annotation.endswith(" | None"):
        if value is None:
            return None
        annotation = annotation[: -len(" | None")]
    elif value is None:
        # Most often a key left without a value (`n_layer:`), which YAML reads as null.
        raise ConfigError(
            path, "must not be null", value=value, allowed="give it a value, or remove the key"
        )
    return _CONVERTERS[annotation](value, path)


def coerce_fields(section: Any, prefix: str) -> None:
    """Convert every dataclass field of `section` in place according to its annotation."""
    for spec in fields(section):
        path = f"{prefix}.{spec.name}" if prefix else spec.name
        setattr(section, spec.name, coerce(getattr(section, spec.name), str(spec.type), path))
