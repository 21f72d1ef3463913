"""Model registry: maps `model.name` to a factory so the trainer never names an architecture."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from speedtronic_config import ConfigError, resolve_section

ModelFactory = Callable[..., Any]
_logger = logging.getLogger(__name__)

# The ModelConfig fields build_model() forwards, as (config field, factory keyword).
_MODEL_FIELDS: tuple[tuple[str, str], ...] = (
    ("vocab_size", "vocab_size"),
    ("max_seq_len", "block_size"),
    ("n_layer", "n_layer"),
    ("n_head", "n_head"),
    ("n_kv_head", "n_kv_head"),
    ("d_model", "d_model"),
    ("d_ff", "d_ff"),
    ("dropout", "dropout"),
    ("tie_weights", "tie_weights"),
    ("rope_base", "rope_base"),
)


class ModelRegistry:
    """Name -> factory table; built-in entries are imported only when first asked for."""

    # Importing torch costs seconds, so the reference model is named here and imported lazily:
    # `import speedtronic_model.registry` stays cheap for `speedtronic validate`.
    _builtin_names: Mapping[str, str] = {
        "reference_transformer": "speedtronic_model.model:ReferenceTransformer",
        "gpt": "speedtronic_model.model:ReferenceTransformer",
    }

    def __init__(self, *, builtins: bool = False) -> None:
        self._factories: dict[str, ModelFactory] = {}
        self._lazy: dict[str, str] = dict(self._builtin_names) if builtins else {}

    def register(self, name: str, factory: ModelFactory | None = None):
        """Register a factory, usable as a decorator or a normal function; returns the factory.

        Registering a name again replaces its factory (notebooks re-run cells; users override
        built-ins), logged at info level.
        """
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"model name must be a non-empty string, got {name!r}")

        def add(fn: ModelFactory) -> ModelFactory:
            if not callable(fn):
                raise TypeError(
                    f"model factory for {name!r} must be callable, got {type(fn).__name__}"
                )
            if name in self:
                _logger.info("model %r: a new factory replaces the registered one", name)
            self._lazy.pop(name, None)
            self._factories[name] = fn
            return fn

        return add if factory is None else add(factory)

    def get(self, name: str) -> ModelFactory:
        """Return the factory registered under name, or raise ConfigError listing the known
        names.
        """
        if name not in self._factories and name in self._lazy:
            module_name, attr = self._lazy.pop(name).split(":")
            self._factories[name] = getattr(importlib.import_module(module_name), attr)
        try:
            return self._factories[name]
        except KeyError:
            known = ", ".join(self.names()) or "(none)"
            raise ConfigError(
                "model.name",
                f"unknown model {name!r}",
                allowed=f"registered models: {known}. Register a factory with "
                f"register_model({name!r}, factory)",
            ) from None

    def names(self) -> tuple[str, ...]:
        """Return every registered name, sorted."""
        return tuple(sorted(self._factories.keys() | self._lazy.keys()))

    def build(self, name: str, **kwargs: Any) -> Any:
        """Call the factory registered under name with kwargs and return the model."""
        return self.get(name)(**kwargs)

    def __contains__(self, name: object) -> bool:
        return name in self._factories or name in self._lazy


registry = ModelRegistry(builtins=True)


def register_model(name: str, factory: ModelFactory | None = None):
    """Register a factory in the process-global registry (decorator or call); a registered name is
    replaced.
    """
    return registry.register(name, factory)


def build_model(config: Any, **overrides: Any) -> Any:
    """Build `config.name` from a ModelConfig (or a whole config, a mapping, None for defaults);
    overrides win over fields.
    """
    section = resolve_section(config, "model")
    kwargs = {keyword: getattr(section, field) for field, keyword in _MODEL_FIELDS}
    # Other keywords are for custom factories and pass through uninterpreted (2.0 contract).
    kwargs.update(factory_keywords(overrides))
    return registry.build(section.name, **kwargs)


def factory_keywords(values: Mapping[str, Any]) -> dict[str, Any]:
    """Return values with config spellings (max_seq_len) renamed to factory keywords (block_size);
    a setting given under both names with different values is a ConfigError.
    """
    out: dict[str, Any] = {}
    for field, keyword in _MODEL_FIELDS:
        if field in values and keyword in values and field != keyword:
            if values[field] != values[keyword]:
                raise ConfigError(
                    f"model.{field}",
                    f"conflicts with {keyword}={values[keyword]!r}",
                    value=values[field],
                    allowed="they are the same setting; give only one",
                )
    for key, value in values.items():
        out[dict(_MODEL_FIELDS).get(key, key)] = value
    return out


__all__ = [
    "ModelFactory",
    "ModelRegistry",
    "build_model",
    "factory_keywords",
    "register_model",
    "registry",
]
