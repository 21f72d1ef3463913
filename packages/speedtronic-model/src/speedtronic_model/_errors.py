"""The one error type for bad model configuration: speedtronic_config.ConfigError."""

from __future__ import annotations

try:
    from speedtronic_config import ConfigError
except ImportError:  # speedtronic-config 2.1 before ConfigError landed; remove once it ships
    class ConfigError(ValueError):  # type: ignore[no-redef]
        """Raised when a run configuration is invalid."""

__all__ = ["ConfigError"]
