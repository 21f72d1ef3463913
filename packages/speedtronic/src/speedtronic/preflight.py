"""Before the first step: prove every folder a run will write is writable, so a bad path costs
seconds, not the steps before the first checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from speedtronic_config import ConfigError, SpeedtronicConfig
from speedtronic_config.atomic import probe_folder


def output_files(config: SpeedtronicConfig) -> list[tuple[str, Path]]:
    """Return (setting, path) for every file the run names: its log and metrics files."""
    names = [(f"logging.{name}", getattr(config.logging, name)) for name in ("file", "json_file")]
    return [(setting, Path(value)) for setting, value in names if value is not None]


def output_folders(config: SpeedtronicConfig) -> list[tuple[str, Path]]:
    """Return (setting, folder) for every folder the run writes: its output, checkpoints, log and
    metrics files (the loss-curve PNG goes beside the metrics), and a DiLoCo node's state.
    """
    output = Path(config.run.output_dir)
    folders = [("run.output_dir", output)]
    if config.checkpoint.enabled:
        directory = Path(config.checkpoint.directory)
        folders.append(("checkpoint.directory", output / directory))  # absolute paths stay
    folders += [(setting, path.parent) for setting, path in output_files(config)]
    if config.distributed.enabled:
        try:
            from speedtronic_diloco.identity import resolve_identity
        except ImportError:  # build_coordinator names the package to install
            return folders
        folders.append(("distributed.state_dir", resolve_identity(config).state_dir))
        if config.distributed.transport == "filesystem":
            folders.append(("distributed.endpoint", Path(config.distributed.endpoint)))
    return folders


def check_output_paths(config: SpeedtronicConfig) -> None:
    """Create and write-probe every output folder; raise ConfigError naming the setting and the
    reason (a folder where a file goes, read-only, full, a file in the way, no permission) for
    the first that fails.
    """
    for setting, path in output_files(config):  # before any folder is created: none is left
        if path.is_dir():
            raise ConfigError(
                setting, f"{path} is a folder", allowed="name a file; nothing was trained"
            )
    for setting, folder in output_folders(config):
        try:
            probe_folder(folder)
        except OSError as error:
            reason = error.strerror or type(error).__name__
            raise ConfigError(
                setting,
                f"cannot write to {folder} ({reason})",
                allowed="choose a writable folder; nothing was trained",
            ) from None


__all__ = ["check_output_paths", "output_files", "output_folders"]
