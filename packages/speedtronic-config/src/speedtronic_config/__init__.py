"""Speedtronic configuration: typed sections, validation and YAML I/O."""

from __future__ import annotations

from speedtronic_config.__about__ import __version__

__all__ = ["__version__"]
