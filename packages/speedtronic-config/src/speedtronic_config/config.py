"""The aggregate SpeedtronicConfig: sections, cross-section normalization, loading and saving."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from speedtronic_config.atomic import atomic_write_text
from speedtronic_config.coerce import coerce
from speedtronic_config.errors import ConfigError
from speedtronic_config.loading import read_config, read_source
from speedtronic_config.normalize import (
    ROOT_FLAGS,
    SECTIONS,
    canonical,
    check_keys,
    compile_flag,
    field_names,
)
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
    check_choice,
    derive,
)
from speedtronic_config.serialize import dump_yaml, redact, section_dict

OOO_STREAMS_RANGE = (1, 8)
# torch.compile's modes: reduce-overhead adds CUDA graphs, max-autotune benchmarks kernel choices.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass
class SpeedtronicConfig:
    """A whole run: one validated dataclass per section plus the root flags."""

    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    shape_validation: ShapeValidationConfig = field(default_factory=ShapeValidationConfig)
    gradient_checkpointing: bool = False
    compile: bool | str = False  # or "auto"
    ooo_backprop: bool = False
    ooo_streams: int = 4
    # 2.1: after 2.0's fields, so a 2.0 call that passes them by position still binds.
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    compile_mode: str = "default"  # torch.compile's mode, when compile is on

    def __post_init__(self) -> None:
        for name, cls in SECTIONS.items():
            value = getattr(self, name)
            if isinstance(value, Mapping):
                value = _build_section(cls, value, name)
            elif not isinstance(value, cls):
                raise ConfigError(name, f"expected a {cls.__name__} or a mapping", value=value)
            setattr(self, name, value)
        self._normalize()

    def _normalize(self) -> None:
        """Apply the cross-section rules (docs/configuration.md, in its order), fixing 2.0's
        unreachable horizon branch.
        """
        for name in ("gradient_checkpointing", "ooo_backprop"):
            setattr(self, name, coerce(getattr(self, name), "bool", name))
        self.compile = compile_flag(self.compile)
        self._check_compile_mode()
        self.ooo_streams = coerce(self.ooo_streams, "int", "ooo_streams")
        low, high = OOO_STREAMS_RANGE
        if not low <= self.ooo_streams <= high:
            raise ConfigError(
                "ooo_streams", f"must be between {low} and {high}", value=self.ooo_streams
            )
        if self.run.max_steps <= 0:
            raise ConfigError("run.max_steps", "must be positive", value=self.run.max_steps)
        if self.distributed.active and self.distributed.role == "single":
            self.distributed.role = "master"  # an enabled run needs a repository owner
        # Derived fields follow their source when validate() runs after an edit (max_seq_len
        # raised in Python): kept, they trained at the old length or failed the check below.
        derive(self.data, "block_size", self.model.max_seq_len)
        # A longer block fails the first step: the reference model has no positions past it.
        if self.model.name in ModelConfig.REFERENCE_NAMES and (
            self.data.block_size > self.model.max_seq_len
        ):
            raise ConfigError(
                "data.block_size",
                f"is longer than model.max_seq_len ({self.model.max_seq_len}), the reference "
                "model's longest sequence",
                value=self.data.block_size,
                allowed=f"use at most {self.model.max_seq_len}, or raise model.max_seq_len",
            )
        derive(self.data, "vocab_size", self.model.vocab_size)
        # A larger one fails mid-run as a bare IndexError: an id past the embedding.
        if self.model.name in ModelConfig.REFERENCE_NAMES and (
            self.data.vocab_size > self.model.vocab_size
        ):
            raise ConfigError(
                "data.vocab_size",
                f"is larger than model.vocab_size ({self.model.vocab_size}), the reference "
                "model's embedding rows",
                value=self.data.vocab_size,
                allowed=f"use at most {self.model.vocab_size}, or raise model.vocab_size",
            )
        derive(self.data, "seed", self.run.seed)
        if self.run.log_every is not None and self.logging.every_steps == 1:
            self.logging.every_steps = self.run.log_every
        self.scheduler.follow_target(self.step_target)
        if self.gradient_checkpointing or self.model.gradient_checkpointing:
            self.gradient_checkpointing = self.model.gradient_checkpointing = True

    def _check_compile_mode(self) -> None:
        check_choice(self, "compile_mode", COMPILE_MODES, path="compile_mode")
        mode = self.compile_mode
        if mode != "default" and self.compile is False:
            raise ConfigError(
                "compile_mode",
                "has no effect while compile is false",
                value=mode,
                allowed="set compile: true (or auto), or drop compile_mode",
            )

    @property
    def step_target(self) -> int:
        """Return the local optimizer-step target: data.max_steps when set, else run.max_steps."""
        return self.data.max_steps if self.data.max_steps is not None else self.run.max_steps

    @property
    def accumulation_steps(self) -> int:
        """Return how many micro-batches make one optimizer step."""
        return self.data.accumulation_steps

    def validate(self) -> SpeedtronicConfig:
        """Re-check every section and cross-section rule (after mutation) and return self."""
        for name in SECTIONS:
            getattr(self, name).__post_init__()
        self._normalize()
        return self

    def to_dict(self, *, redact_secrets: bool = False) -> dict[str, Any]:
        """Return plain data that from_dict turns back into an equal config."""
        tree: dict[str, Any] = {name: section_dict(getattr(self, name)) for name in SECTIONS}
        if self.scheduler.follows_target:
            tree["scheduler"]["max_steps"] = (
                None  # keep "follow the step target" through a round trip
            )
        for spec in fields(self):
            if spec.name not in SECTIONS:
                tree[spec.name] = getattr(self, spec.name)
        return redact(tree) if redact_secrets else tree

    def to_yaml(self, *, redact_secrets: bool = False) -> str:
        """Return the config as YAML text."""
        return dump_yaml(self.to_dict(redact_secrets=redact_secrets))

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the redacted YAML atomically to `path` and return the path."""
        return atomic_write_text(path, self.to_yaml(redact_secrets=True))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None = None) -> SpeedtronicConfig:
        """Return a validated config from a mapping (aliases and shorthands accepted)."""
        tree = canonical(values)
        sections = {
            name: _build_section(section_cls, tree[name], name)
            for name, section_cls in SECTIONS.items()
        }
        flags = {name: tree[name] for name in ROOT_FLAGS}
        return cls(**sections, **flags)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> SpeedtronicConfig:
        """Return a validated config from a YAML (or .json) file."""
        return cls.from_dict(read_config(path))

    @classmethod
    def load(cls, source: str | os.PathLike[str] | Mapping[str, Any]) -> SpeedtronicConfig:
        """Return a validated config from a mapping, a file path, or inline YAML/JSON text."""
        return cls.from_dict(read_source(source))


def _build_section(cls: type, values: Mapping[str, Any], path: str) -> Any:
    check_keys(values, cls, path)
    # Copy lists so the section never shares them with the caller's mapping.
    return cls(
        **{key: list(value) if isinstance(value, list) else value for key, value in values.items()}
    )


def resolve_section(value: Any, name: str) -> Any:
    """Return the typed `name` section of value: a whole config, the section itself, a mapping or
    object holding some of its fields, or None (every default). Cross-section defaults apply.
    """
    cls = SECTIONS[name]
    if isinstance(value, SpeedtronicConfig):
        return getattr(value, name)
    if isinstance(value, cls):
        return value
    if value is not None and not isinstance(value, Mapping) and hasattr(value, name):
        return resolve_section(getattr(value, name), name)  # a duck-typed whole config
    if value is None:
        values: dict[str, Any] = {}
    elif isinstance(value, Mapping):
        values = dict(value)
    else:
        values = {f: getattr(value, f) for f in field_names(cls) if hasattr(value, f)}
    return getattr(SpeedtronicConfig.from_dict({name: values}), name)
