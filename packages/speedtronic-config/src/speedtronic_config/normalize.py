"""Turn a user mapping (aliases, shorthands) into one canonical mapping per section."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from speedtronic_config.coerce import coerce
from speedtronic_config.errors import ConfigError, unknown_key
from speedtronic_config.sections import (
    CheckpointConfig,
    DataConfig,
    DistributedConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    PrecisionConfig,
    RunConfig,
    SchedulerConfig,
    ShapeValidationConfig,
)

SECTIONS: dict[str, type] = {
    "run": RunConfig,
    "model": ModelConfig,
    "data": DataConfig,
    "optimizer": OptimizerConfig,
    "scheduler": SchedulerConfig,
    "precision": PrecisionConfig,
    "checkpoint": CheckpointConfig,
    "logging": LoggingConfig,
    "distributed": DistributedConfig,
    "shape_validation": ShapeValidationConfig,
    "parallel": ParallelConfig,
}
ROOT_FLAGS = ("gradient_checkpointing", "compile", "ooo_backprop", "ooo_streams", "compile_mode")
RUN_ALIASES = ("name", "seed", "device", "max_steps", "output_dir", "log_every")
SECTION_ALIASES = ("hub", "diloco")
OPTIMIZER_ROOT_FIELDS = ("muon_plus", "cautious")
ROOT_KEYS = (*SECTIONS, *ROOT_FLAGS, *RUN_ALIASES, *SECTION_ALIASES, *OPTIMIZER_ROOT_FIELDS)


def field_names(cls: type) -> list[str]:
    """Return the init field names of a section dataclass."""
    return [spec.name for spec in fields(cls) if spec.init]


# A section these take a name for: its shorthand (`precision: bf16`), shown in the fix.
_SHORTHAND_EXAMPLES = {"optimizer": "muon", "precision": "bf16"}


def _section(values: Mapping[str, Any], key: str) -> dict[str, Any]:
    raw = values.get(key)
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        fix = f"write its fields as `field: value` lines indented under {key}:"
        if key in _SHORTHAND_EXAMPLES:  # `precision: off` is YAML 1.1's false, not a mode
            fix += f", or name one, e.g. {key}: {_SHORTHAND_EXAMPLES[key]}"
        raise ConfigError(key, "expected a mapping", value=raw, allowed=fix)
    return dict(raw)


def unknown_field(path: str, key: Any, valid: list[str] | tuple[str, ...]) -> ConfigError:
    """Return unknown_key's error, or, for a field of other sections, one naming them (`lr` at the
    top level: did you mean optimizer.lr?): a name close to one here is a weaker hint.
    """
    section, dot, rest = str(key).partition(".")
    if not path and dot and section in (*SECTIONS, *SECTION_ALIASES, "compile"):
        return ConfigError(
            str(key),
            "unknown key (a dotted name is the --set and --cuda-overlay form)",
            allowed=f"nest it in a config file: {section}: {{{rest}: ...}}",
        )
    owners = [
        f"{name}.{key}"
        for name, cls in SECTIONS.items()
        if name != path and key in field_names(cls)
    ]
    if not owners:
        return unknown_key(path, key, valid)
    where = f"{path}.{key}" if path else str(key)
    return ConfigError(where, "unknown key", allowed=f"did you mean {' or '.join(owners)}?")


def check_keys(section: Mapping[str, Any], cls: type, path: str) -> None:
    """Raise ConfigError for the first key that is not a field of `cls`, with a suggestion."""
    valid = field_names(cls)
    for key in section:
        if key not in valid:
            raise unknown_field(path, key, valid)


def _distributed(values: Mapping[str, Any]) -> dict[str, Any]:
    present = [key for key in ("distributed", *SECTION_ALIASES) if key in values]
    if len(present) > 1:
        raise ConfigError(
            present[1],
            f"conflicts with {present[0]}",
            allowed="hub: and diloco: are aliases accepted only when distributed: is absent",
        )
    return _section(values, present[0]) if present else {}


def _optimizer(values: Mapping[str, Any]) -> dict[str, Any]:
    raw = values.get("optimizer")
    section = {"name": raw} if isinstance(raw, str) else _section(values, "optimizer")
    for key in OPTIMIZER_ROOT_FIELDS:
        if key not in values:
            continue
        root = coerce(values[key], "bool", key)
        if key in section and coerce(section[key], "bool", f"optimizer.{key}") != root:
            raise ConfigError(
                key,
                f"conflicts with optimizer.{key}={section[key]!r}",
                value=values[key],
                allowed="set it in one place",
            )
        section[key] = root
    return section


def _precision(values: Mapping[str, Any]) -> dict[str, Any]:
    raw = values.get("precision")
    return {"mode": raw} if isinstance(raw, str) else _section(values, "precision")


def _compile(value: Any) -> bool | str:
    if isinstance(value, Mapping):
        for key in value:
            if key != "enabled":
                raise unknown_compile_key(key)
        return compile_flag(value.get("enabled", False), "compile.enabled")
    return compile_flag(value, "compile")


def unknown_compile_key(key: Any) -> ConfigError:
    """Return the error for a key of the `compile: {enabled: ...}` mapping other than enabled."""
    if key == "mode":  # torch.compile's mode is a root setting of its own
        return ConfigError(
            "compile.mode", "unknown key", allowed="set compile_mode at the top level"
        )
    return unknown_key("compile", key, ["enabled"])


def compile_flag(value: Any, path: str = "compile") -> bool | str:
    """Return True, False or "auto" (the trainer decides from the device and the run's length)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return coerce(value, "bool", path)
    except ConfigError:
        raise ConfigError(path, "expected a boolean or auto", value=value) from None


def canonical(values: Mapping[str, Any] | None) -> dict[str, Any]:
    """Return {section: mapping, flag: value}, with aliases applied and unknown keys rejected."""
    if values is None:
        values = {}
    if not isinstance(values, Mapping):
        raise ConfigError(
            "",
            f"the configuration root must be a mapping, not {type(values).__name__}",
            allowed="write `key: value` lines at the top level",
        )
    for key in values:
        if key not in ROOT_KEYS:
            raise unknown_field("", key, ROOT_KEYS)
    special = {"distributed": _distributed, "optimizer": _optimizer, "precision": _precision}
    result: dict[str, Any] = {
        name: special.get(name, lambda v, n=name: _section(v, n))(values) for name in SECTIONS
    }
    for alias in RUN_ALIASES:
        if alias in values:  # the top-level alias wins over the nested run field (2.0 rule)
            result["run"][alias] = values[alias]
    result["gradient_checkpointing"] = coerce(
        values.get("gradient_checkpointing", False), "bool", "gradient_checkpointing"
    )
    result["compile"] = _compile(values.get("compile", False))
    result["ooo_backprop"] = coerce(values.get("ooo_backprop", False), "bool", "ooo_backprop")
    result["ooo_streams"] = coerce(values.get("ooo_streams", 4), "int", "ooo_streams")
    result["compile_mode"] = values.get("compile_mode", "default")
    return result
