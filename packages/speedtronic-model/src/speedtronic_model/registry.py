"""Model registry: maps `model.name` to a factory so the trainer never names an architecture."""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from speedtronic_config import ConfigError, ModelConfig, resolve_section
from speedtronic_config.errors import choices_hint

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

ModelFactory = Callable[..., Any]
_logger = logging.getLogger(__name__)

# Installed packages provide models as `name = "module:factory"` entries of this group, so a fresh
# process (the CLI) finds models that no code of its own registers.
ENTRY_POINT_GROUP = "speedtronic.models"

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
    """Name -> factory table; built-in and entry-point models are imported when first asked for.

    For one name, register() wins (whenever it is called), then a built-in, then the first entry
    point on sys.path. An entry point passed over is logged: a warning when a built-in or another
    distribution keeps the name (installing a package never silently changes what a config
    trains), info when register() replaced it.
    """

    # Importing torch costs seconds, so the reference model is named here and imported lazily:
    # `import speedtronic_model.registry` stays cheap for `speedtronic validate`.
    _builtin_names: Mapping[str, str] = dict.fromkeys(
        ModelConfig.REFERENCE_NAMES, "speedtronic_model.model:ReferenceTransformer"
    )

    def __init__(self, *, builtins: bool = False, plugins: bool = False) -> None:
        """Start empty, or with the built-ins; `plugins` adds ENTRY_POINT_GROUP's entry points."""
        self._factories: dict[str, ModelFactory] = {}
        self._lazy: dict[str, str] = dict(self._builtin_names) if builtins else {}
        self._builtins = frozenset(self._lazy)
        # Lazy name -> the entry point providing it: it loads the factory and is cited in errors.
        self._entry_points: dict[str, EntryPoint] = {}
        self._plugins = plugins
        # Reading every installed distribution's metadata costs milliseconds per sys.path folder:
        # done on the first lookup that needs it, never on import (`speedtronic validate`).
        self._scanned = False

    def register(self, name: str, factory: ModelFactory | None = None):
        """Register a factory, usable as a decorator or a normal function; returns the factory.

        Registering a name again replaces its factory (notebooks re-run cells; users override
        built-ins and entry points), logged at info level.
        """
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"model name must be a non-empty string, got {name!r}")

        def add(fn: ModelFactory) -> ModelFactory:
            if not callable(fn):
                raise TypeError(
                    f"model factory for {name!r} must be callable, got {type(fn).__name__}"
                )
            if name in self._factories or name in self._lazy:
                _logger.info("model %r: a new factory replaces the registered one", name)
            self._lazy.pop(name, None)
            self._entry_points.pop(name, None)
            self._factories[name] = fn
            return fn

        return add if factory is None else add(factory)

    def get(self, name: str) -> ModelFactory:
        """Return the factory registered under name, or raise ConfigError listing the known
        names.
        """
        if name not in self._factories and name not in self._lazy:
            self._scan_entry_points()
        if name not in self._factories and name in self._lazy:
            self._factories[name] = self._load(name)
            del self._lazy[name]
            self._entry_points.pop(name, None)
        try:
            return self._factories[name]
        except KeyError:
            names = self.names() or ("(none)",)
            plugin = (
                f", or as an entry point in group {ENTRY_POINT_GROUP!r}" if self._plugins else ""
            )
            raise ConfigError(
                "model.name",
                f"unknown model {name!r}",
                allowed=choices_hint(name, names, "registered models:")
                + f". Register a factory with register_model({name!r}, factory){plugin}",
            ) from None

    def names(self) -> tuple[str, ...]:
        """Return every name (registered, built in, declared by an entry point), sorted."""
        self._scan_entry_points()
        return tuple(sorted(self._factories.keys() | self._lazy.keys()))

    def build(self, name: str, **kwargs: Any) -> Any:
        """Call the factory registered under name with kwargs and return the model; a factory
        whose signature cannot take kwargs, or that returns None, is a ConfigError naming it.
        """
        factory = self.get(name)
        # Checked before the call: a TypeError from inside the factory is the user's own, kept.
        try:
            signature = inspect.signature(factory)
        except (TypeError, ValueError):  # some builtins and C callables have none
            signature = None
        described = f"{getattr(factory, '__name__', type(factory).__name__)}{signature or ''}"
        if signature is not None:
            try:
                signature.bind(**kwargs)
            except TypeError as error:
                raise ConfigError(
                    "model.name",
                    f"the factory of model {name!r}, {described}, cannot be called with the "
                    f"model fields ({error})",
                    allowed=f"it is called with {', '.join(sorted(kwargs))}: give it **kwargs "
                    "to take the ones it does not use",
                ) from None
        model = factory(**kwargs)
        if model is None:
            raise ConfigError(
                "model.name",
                f"the factory of model {name!r}, {described}, returned None",
                allowed="it must return the model it builds",
            )
        return model

    def __contains__(self, name: object) -> bool:
        if name not in self._factories and name not in self._lazy:
            self._scan_entry_points()
        return name in self._factories or name in self._lazy

    def _scan_entry_points(self) -> None:
        """Add ENTRY_POINT_GROUP's entry points as lazy entries, once, without importing them."""
        if not self._plugins or self._scanned:
            return
        from importlib.metadata import entry_points

        self._scanned = True
        for point in entry_points(group=ENTRY_POINT_GROUP):
            name = point.name
            if name in self._builtins:
                _logger.warning(
                    "model %r: ignoring %s: the built-in model keeps the name "
                    "(register_model(%r, factory) replaces a built-in explicitly)",
                    name,
                    _describe(point),
                    name,
                )
            elif name in self._entry_points:
                _logger.warning(
                    "model %r: ignoring %s: %s comes first on sys.path",
                    name,
                    _describe(point),
                    _describe(self._entry_points[name]),
                )
            elif name in self._factories:
                _logger.info(
                    "model %r: ignoring %s: register_model() replaced it", name, _describe(point)
                )
            else:
                self._lazy[name] = point.value
                self._entry_points[name] = point

    def _load(self, name: str) -> ModelFactory:
        """Import and return the lazy entry's factory; an entry point that fails is a one-line
        ConfigError naming it, its distribution and the cause.
        """
        point = self._entry_points.get(name)
        if point is None:  # a built-in: failing to import it is a broken install, not a config
            module_name, attr = self._lazy[name].split(":")
            return getattr(importlib.import_module(module_name), attr)
        try:
            factory = point.load()
        except Exception as error:
            raise _entry_point_error(name, point, _first_line(error)) from error
        if not callable(factory):
            raise _entry_point_error(
                name, point, f"not a callable factory (got {type(factory).__name__})"
            )
        return factory


def _describe(point: EntryPoint) -> str:
    """Return `entry point NAME = module:attr of distribution DIST VERSION`."""
    dist = point.dist
    return f"entry point {point.name} = {point.value} of distribution {dist.name} {dist.version}"


def _first_line(error: BaseException) -> str:
    """Return `Type: first line of the message`: the cause, kept to the error's one line."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def _entry_point_error(name: str, point: EntryPoint, problem: str) -> ConfigError:
    """Return the ConfigError for a model whose entry point cannot give a factory."""
    return ConfigError(
        "model.name",
        f"model {name!r} comes from {_describe(point)}, which fails: {problem}",
        allowed=f"fix or uninstall {point.dist.name}, or register the model with register_model",
    )


registry = ModelRegistry(builtins=True, plugins=True)


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
    if section.loss_chunk_size is not None:  # opt-in: 2.0 factories without **kwargs still bind
        kwargs["loss_chunk_size"] = section.loss_chunk_size
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
    "ENTRY_POINT_GROUP",
    "ModelFactory",
    "ModelRegistry",
    "build_model",
    "factory_keywords",
    "register_model",
    "registry",
]
