"""Before the first step: prove every folder a run will write is writable, so a bad path costs
seconds, not the steps before the first checkpoint; and leave nothing behind when a run is
refused after that.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from speedtronic.run_lock import LOCK_NAME, RunFolderBusy, remove_unheld_lock, run_folders
from speedtronic_config import ConfigError, SpeedtronicConfig
from speedtronic_config.atomic import (
    missing_folders,
    probe_folder,
    remove_empty_folders,
    unwritable_reason,
)
from speedtronic_config.errors import first_refusal, on_every_rank


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
    if config.distributed.active:  # not mode: disabled/single, which build no node
        try:
            from speedtronic_diloco.identity import resolve_identity
        except ImportError:  # build_coordinator names the package to install
            return folders
        folders.append(("distributed.state_dir", resolve_identity(config).state_dir))
        if config.distributed.transport == "filesystem":
            # The repository's own folder, where the transport writes: a file in its way fails
            # here, not as an OSError at the first commit.
            repo = Path(config.distributed.endpoint) / (config.distributed.repo_id or "")
            folders.append(("distributed.endpoint", repo))
    return folders


def check_output_paths(
    config: SpeedtronicConfig, gather: Callable[[Any], list[Any]] = lambda x: [x]
) -> None:
    """Create and write-probe every output folder; raise ConfigError naming the setting and the
    reason (a folder where a file goes, read-only, full, a file in the way, no permission) for
    the first that fails. `gather` (a group's all_gather_object) makes every rank raise when any
    rank would.
    """
    refuse_together(_output_paths_refusal(config), gather)


def _output_paths_refusal(config: SpeedtronicConfig) -> ConfigError | None:
    """Return check_output_paths's error for this process's folders, or None."""
    for setting, path in output_files(config):  # before any folder is created: none is left
        if path.is_dir():
            return ConfigError(
                setting, f"{path} is a folder", allowed="name a file; nothing was trained"
            )
    for setting, folder in output_folders(config):
        try:
            probe_folder(folder)
        except OSError as error:
            reason = unwritable_reason(folder, error)
            return ConfigError(
                setting,
                f"cannot write to {folder} ({reason})",
                allowed="choose a writable folder; nothing was trained",
            )
    return None


def refuse_together(
    refusal: Exception | None, gather: Callable[[Any], list[Any]] = lambda x: [x]
) -> None:
    """Raise on every rank the first of the ranks' refusals (this rank's `refusal`, a ConfigError
    or an error made from its message alone, such as a DataError; gathered by `gather`, a
    group's all_gather_object), naming the ranks that refused when not all did; return when none
    did. Each rank reads its own node's files: a rank refusing alone would leave its peers
    waiting for it in their next collective.
    """
    first = first_refusal(gather(refusal))
    if first is None:
        return
    error, where = first
    if where and isinstance(error, ConfigError):  # say whose files refused
        error = ConfigError(error.path, where + error.problem, allowed=error.allowed)
    elif where:
        error = type(error)(where + str(error))
    raise on_every_rank(error)


def check_init_tokenizer(
    config: SpeedtronicConfig, gather: Callable[[Any], list[Any]] = lambda x: [x]
) -> None:
    """Raise ConfigError when model.init_from names a Hugging Face folder whose tokenizer.json
    maps text to other ids than the tokenizer of the run's training data: the weights would learn
    from tokens that mean other text. A folder without a tokenizer.json, or data whose tokenizer
    is unknown (synthetic, a Dataset object), is not checked; nor without the tokenizers package,
    which reading a tokenizer.json needs (init_from itself does not). `gather` (a group's
    all_gather_object) makes every rank raise when any rank would.
    """
    try:
        refusal = _init_tokenizer_refusal(config)
    except ConfigError as error:  # init_from names no usable folder on this rank
        refusal = error
    # Each rank read its own files (nodes without a shared filesystem can hold other ones).
    refuse_together(refusal, gather)


def _init_tokenizer_refusal(config: SpeedtronicConfig) -> ConfigError | None:
    """Return check_init_tokenizer's error for this process's files, or None."""
    if config.model.init_from is None or importlib.util.find_spec("tokenizers") is None:
        return None
    from speedtronic_data import JsonTokenizer, training_tokenizer
    from speedtronic_data.tokenizer_record import TOKENIZER_JSON, record_for
    from speedtronic_model.hf_llama import hf_folder

    folder = hf_folder(config.model.init_from)
    if not (folder / TOKENIZER_JSON).is_file():
        return None
    data = training_tokenizer(config.data)
    if data is None:
        return None
    weights = record_for(JsonTokenizer.from_file(folder / TOKENIZER_JSON))
    weights = dataclasses.replace(weights, name=str(folder / TOKENIZER_JSON), folder=folder)
    if weights.encodes_alike(data):
        return None
    where = f" ({data.folder})" if data.folder is not None else ""
    return ConfigError(
        "model.init_from",
        f"{folder} was trained with {weights.describe()}, but the run's training data{where} "
        f"holds tokens of {data.describe()}, so the weights would learn from ids that mean "
        "other text",
        allowed="prepare the data with its tokenizer: "
        f"speedtronic prepare OUT --tokenizer {folder}",
    )


class NewOutputs:
    """What of a run's outputs does not exist yet, so a refused run can remove what it made."""

    def __init__(self, config: SpeedtronicConfig) -> None:
        self.files = [path for _, path in output_files(config) if not path.exists()]
        self.locked = [path for path in run_folders(config) if not (path / LOCK_NAME).exists()]
        folders = output_folders(config)
        self.folders = missing_folders(*(folder for _, folder in folders))
        self.checkpoint_folders = missing_folders(
            *(folder for setting, folder in folders if setting == "checkpoint.directory")
        )

    def remove(self, *, files: bool = True) -> None:
        """Remove what was made since the snapshot: the log files (unless `files` is False), the
        lock files (unless a live run holds one), then the folders left empty; call only when
        nothing was trained.
        """
        for path in self.files if files else ():
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        for folder in self.locked:
            remove_unheld_lock(folder)
        remove_empty_folders(self.folders)

    def tie_to(self, owner: object) -> weakref.finalize:
        """When `owner` (the run's trainer) goes, remove the checkpoint folder (and its parents)
        made for the run if no checkpoint was written to it: a save makes it again. A folder
        holding anything is kept; so is every other folder (a DiLoCo node's shared one may be
        written by other nodes). Return the finalizer, which does it sooner when called.
        """
        return weakref.finalize(owner, remove_empty_folders, self.checkpoint_folders)

    @contextlib.contextmanager
    def removed_on_error(self) -> Iterator[None]:
        """Run the body; remove() when it raises."""
        try:
            yield
        except RunFolderBusy:
            # Refused before opening its logs: a log file new since the snapshot is the live
            # run's. Its own folders and the lock of a folder not busy are removed.
            self.remove(files=False)
            raise
        except BaseException:
            self.remove()
            raise


__all__ = [
    "NewOutputs",
    "check_init_tokenizer",
    "check_output_paths",
    "output_files",
    "output_folders",
    "refuse_together",
]
