"""Before the first step: prove every folder a run will write is writable, so a bad path costs
seconds, not the steps before the first checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from speedtronic_config import ConfigError, SpeedtronicConfig
from speedtronic_systems.atomic import probe_folder


def output_folders(config: SpeedtronicConfig) -> list[tuple[str, Path]]:
    """Return (setting, folder) for every folder the run writes: its output, checkpoints, log and
    metrics files (the loss-curve PNG goes beside the metrics), and a DiLoCo node's state.
    """
    output = Path(config.run.output_dir)
    folders = [("run.output_dir", output)]
    if config.checkpoint.enabled:
        directory = Path(config.checkpoint.directory)
        folders.append(("checkpoint.directory", output / directory))  # absolute paths stay
    for name in ("file", "json_file"):
        value = getattr(config.logging, name)
        if value is not None:
            folders.append((f"logging.{name}", Path(value).parent))
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
    reason (read-only, full, a file in the way, no permission) for the first that fails.
    """
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


__all__ = ["check_output_paths", "output_folders"]
