"""Atomic local checkpoint storage and discovery, plus RNG capture for exact resume."""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import random
import re
import shutil
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from speedtronic_config import CheckpointConfig, resolve_section
from speedtronic_config.atomic import atomic_json_dump, fsync_folder, remove_stale_temp_files
from speedtronic_systems.atomic import atomic_torch_save
from speedtronic_trainer.checkpoint_checks import (
    RESUME_HINT,
    CheckpointError,
    load_checkpoint_file,
)
from speedtronic_trainer.sharded import TRAINER_STATE, damaged_shards

# step_<n>.pt: one file (one process, or DDP's rank 0); step_<n>.dcp: a folder of FSDP2 shards.
_STEP_FILE = re.compile(r"^step_(\d+)\.(pt|dcp)$")
LATEST_POINTER = "latest"
# A sharded save's folder while its ranks write (.step_<n>.dcp.partial), and the folder of that
# step it replaces while the new one moves in (.step_<n>.dcp.retired).
STAGING_SUFFIX, RETIRED_SUFFIX = ".partial", ".retired"
_DEFAULTS = CheckpointConfig()


def _warn_on_stderr(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


class CheckpointManager:
    """Manage local checkpoints (step_<n>.pt files, FSDP2 step_<n>.dcp folders) and a latest
    pointer.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        every_steps: int = _DEFAULTS.every_steps,
        keep_last: int | None = _DEFAULTS.keep_last,
        enabled: bool = _DEFAULTS.enabled,
    ) -> None:
        # CheckpointConfig owns the rules (a ConfigError names checkpoint.<field>).
        CheckpointConfig(every_steps=every_steps, keep_last=keep_last, enabled=enabled)
        self.directory = Path(directory)
        self.every_steps = every_steps
        self.keep_last = keep_last
        self.enabled = enabled
        # The newest checkpoint of this run (committed here, or resumed by load_latest): the one
        # a failed write names as intact. `latest` may name an earlier run's, which this run
        # started fresh beside, or a damaged file the resume fell back from.
        self.run_checkpoint: Path | None = None

    @classmethod
    def from_config(
        cls, section: Any, output_dir: str | os.PathLike[str] = "."
    ) -> CheckpointManager:
        """Build a manager from a CheckpointConfig-like section; relative directories sit under
        output_dir.
        """
        section = resolve_section(section, "checkpoint")
        directory = Path(section.directory)
        if not directory.is_absolute():
            directory = Path(output_dir) / directory
        return cls(
            directory,
            every_steps=section.every_steps,
            keep_last=section.keep_last,
            enabled=section.enabled,
        )

    def should_save(self, step: int) -> bool:
        """Return True when `step` is a positive exact multiple of the interval and saving is
        enabled.
        """
        return self.enabled and step > 0 and step % self.every_steps == 0

    def path_for(self, step: int) -> Path:
        """Return the file path of the checkpoint for `step`."""
        return self.directory / f"step_{step}.pt"

    def sharded_path_for(self, step: int) -> Path:
        """Return the folder of the sharded (FSDP2) checkpoint for `step`."""
        return self.directory / f"step_{step}.dcp"

    def sharded_staging_for(self, step: int) -> Path:
        """Return the folder the ranks write `step`'s shards in before it takes its step name
        (publish_sharded): DCP writes a folder in place, so a save interrupted over a checkpoint
        of the same step would leave old metadata with new shards.
        """
        return self.directory / f".step_{step}.dcp{STAGING_SUFFIX}"

    def publish_sharded(self, staging: Path, state: dict[str, Any]) -> Path:
        """Write the trainer state into a staging folder every rank has finished, then give it its
        step name, replacing a folder of that name (a rerun) only now; return it. A failed write
        is a CheckpointError saying the previous checkpoint is intact.
        """
        final = self.directory / staging.name.removeprefix(".").removesuffix(STAGING_SUFFIX)
        retired = self.directory / f".{final.name}{RETIRED_SUFFIX}"
        try:
            atomic_torch_save(state, staging / TRAINER_STATE)
            if final.exists():
                shutil.rmtree(retired, ignore_errors=True)
                os.replace(final, retired)
            os.replace(staging, final)
            fsync_folder(self.directory)
        except OSError as error:
            raise self.write_failure(error, final) from error
        shutil.rmtree(retired, ignore_errors=True)
        return final

    def save(self, step: int, state: dict[str, Any], *, prune: bool = True) -> Path:
        """Write `state` atomically, then move the latest pointer to it and prune old files
        (unless `prune` is false); a failed write is a CheckpointError saying the previous
        checkpoint is intact.
        """
        path = self.write(self.path_for(step), state)
        self.commit(path, prune=prune)
        return path

    def write(self, path: Path, state: dict[str, Any]) -> Path:
        """Write `state` to the step file `path` atomically; a failed write is a CheckpointError
        saying the previous checkpoint is intact.
        """
        try:
            atomic_torch_save(state, path)
        except OSError as error:
            raise self.write_failure(error, path) from error
        return path

    def commit(self, path: Path, *, prune: bool = True) -> None:
        """Point `latest` at a complete checkpoint, then prune (unless `prune` is false); call it
        once every part is on disk (under data parallelism: after every rank has finished).
        """
        step = checkpoint_step(path)
        try:
            atomic_json_dump({"step": step, "file": path.name}, self.directory / LATEST_POINTER)
        except OSError as error:
            raise self.write_failure(error, path) from error
        self.run_checkpoint = path
        if prune:
            self.prune()

    def write_failure(self, error: OSError, path: Path) -> CheckpointError:
        """Return one line: why writing the checkpoint at `path` failed, and which checkpoint of
        this run (run_checkpoint) stands, if any.
        """
        step = checkpoint_step(path)
        what = (
            f"no space left on {self.directory}"
            if error.errno == errno.ENOSPC
            else f"cannot write {self.directory} ({error.strerror or type(error).__name__})"
        )
        earlier = self.latest_path()
        if self.run_checkpoint is not None:
            kept = f"the previous checkpoint is intact ({self.run_checkpoint.name})"
        elif earlier is not None:  # not this run's: resuming it would continue another run
            kept = f"no checkpoint of this run was written ({earlier.name} is an earlier run's)"
        else:
            kept = "no earlier checkpoint exists"
        return CheckpointError(f"{what} while writing step {step}; {kept}")

    def latest_path(self) -> Path | None:
        """Return the checkpoint the latest pointer names, else the highest-numbered file, else
        None.
        """
        target = self._pointer_target()
        if isinstance(target, Path) and target.exists():
            return target
        paths = self.checkpoint_paths()
        return paths[-1] if paths else None

    def _pointer_target(self) -> Path | str | None:
        """Return the path the latest pointer names, None without a pointer, or "unreadable"."""
        pointer = self.directory / LATEST_POINTER
        if not pointer.is_file():
            return None
        try:
            return self.directory / json.loads(pointer.read_text())["file"]
        except (OSError, ValueError, KeyError, TypeError):
            return "unreadable"  # a damaged pointer is not fatal: the step files are the truth

    def _pointer_fallback(self, latest: Path | None) -> str | None:
        """Return one line when the pointer names no existing checkpoint and `latest`, the newest
        step file, is resumed instead (or, None, there is none): the steps after that file are
        lost, which must not go unsaid.
        """
        target = self._pointer_target()
        if target is None or (isinstance(target, Path) and target.exists()):
            return None
        what = (
            "is unreadable"
            if isinstance(target, str)
            else f"names {target.name}, which does not exist"
        )
        if latest is None:
            return f"`latest` in {self.directory} {what}, and no other checkpoint is there"
        return (
            f"`latest` in {self.directory} {what}; resuming from the newest checkpoint there, "
            f"{latest.name}"
        )

    def load(
        self, path: str | os.PathLike[str], *, hint: str | None = RESUME_HINT
    ) -> dict[str, Any]:
        """Load one checkpoint with weights_only=True, raising CheckpointError naming a bad file
        (ending with `hint`, when given).

        For a sharded folder this is its trainer state, with "sharded" set to the folder: the
        model and optimizer shards load into a live model (speedtronic_trainer.sharded).
        """
        path = Path(path)
        if path.suffix == ".dcp":
            if not (path / ".metadata").is_file():
                raise CheckpointError(
                    f"sharded checkpoint {path} is incomplete (no .metadata: a rank did not "
                    f"finish writing){f'; {hint}' if hint else ''}"
                )
            damage = damaged_shards(path)
            if damage is not None:  # found here, an older checkpoint can still be chosen
                raise CheckpointError(
                    f"sharded checkpoint {path} is damaged ({damage}){f'; {hint}' if hint else ''}"
                )
            state = load_checkpoint_file(path / TRAINER_STATE, hint)
            state["sharded"] = str(path)
            return state
        return load_checkpoint_file(path, hint)

    def load_latest(self, warn: Callable[[str], None] | None = None) -> dict[str, Any] | None:
        """Load the newest valid checkpoint, reporting each unreadable newer one in one line
        through `warn` (default: a `warning:` line on stderr); None when there is none.
        """
        latest = self.latest_path()
        warn = warn or _warn_on_stderr
        fallback = self._pointer_fallback(latest)
        if fallback is not None:
            warn(fallback)
        if latest is None:
            return None
        # Only older ones: a step past the one `latest` names is an earlier run's, which this
        # run started fresh beside (or rewound from), not a state of this run.
        candidates = [latest] + [
            p for p in reversed(self.checkpoint_paths()) if _step_of(p) < _step_of(latest)
        ]
        failures: list[str] = []
        for path in candidates:
            try:
                state = self.load(path, hint=None)
            except CheckpointError as exc:
                failures.append(str(exc))
                warn(f"{exc}; trying an older checkpoint")
                continue
            state.setdefault("checkpoint_path", str(path))
            self.run_checkpoint = path
            return state
        newer = [p.name for p in self.checkpoint_paths() if _step_of(p) > _step_of(latest)]
        if newer:
            failures.append(
                f"not tried: {', '.join(newer)}, past the step `latest` names (an earlier run's)"
            )
        raise CheckpointError(
            f"no loadable checkpoint in {self.directory}: {'; '.join(failures)}; to go on, put "
            "an undamaged copy of one there, or start a new run in another run.output_dir"
        )

    def checkpoint_paths(self) -> list[Path]:
        """Return step_<n>.pt files and step_<n>.dcp folders sorted by step, oldest first."""
        try:
            entries = list(self.directory.iterdir())
        except (FileNotFoundError, NotADirectoryError):
            # None yet; or gone since a check: a peer rank whose trainer ended removes the empty
            # checkpoint folder it made (speedtronic.preflight.NewOutputs.tie_to).
            return []
        found = [(step, p) for p in entries if (step := checkpoint_step(p)) is not None]
        return [p for _, p in sorted(found)]

    def prune(self) -> None:
        """Delete all but the newest keep_last checkpoints up to the one the latest pointer names
        (never that one), and any temp file an interrupted save left.
        """
        self.remove_stale_temp_files()
        if self.keep_last is None:
            return
        keep = self.latest_path()
        # keep_last counts this run's own: steps past the one `latest` names are an earlier
        # run's (a fresh start beside it), kept until this run saves their steps.
        limit = _step_of(keep) if keep is not None else math.inf
        own = [path for path in self.checkpoint_paths() if _step_of(path) <= limit]
        for path in own[: -self.keep_last]:
            if path == keep:
                continue
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

    def remove_stale_temp_files(self) -> list[Path]:
        """Delete the temp files a save killed between writing and renaming left (a checkpoint's
        full size each), and the staging and retired folders of sharded saves; return them. Call
        it only while this manager is not saving.
        """
        folders = [
            path
            for suffix in (STAGING_SUFFIX, RETIRED_SUFFIX)
            for path in sorted(self.directory.glob(f".step_*.dcp{suffix}"))
        ]
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
        return folders + [
            path
            for name in ("step_*.pt", LATEST_POINTER)
            for path in remove_stale_temp_files(self.directory, name)
        ]

    def copy_to(self, destination: str | os.PathLike[str]) -> Path:
        """Copy the latest checkpoint to `destination` (a file path, or an existing folder) and
        return the copy.
        """
        source = self.latest_path()
        if source is None:
            raise CheckpointError(f"no checkpoint to copy in {self.directory}")
        destination = Path(destination)
        if destination.is_dir():
            destination = destination / source.name
        destination.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, destination)
        else:
            shutil.copy2(source, destination)
        return destination


def checkpoint_step(path: Path) -> int | None:
    """Return the step of a step_<n>.pt file or step_<n>.dcp folder, by its name; None for a
    file of another name (one a hand-edited pointer may name).
    """
    match = _STEP_FILE.match(path.name)
    return int(match.group(1)) if match else None


def checkpoint_digest(path: str | os.PathLike[str]) -> str:
    """Return a short digest of a checkpoint's contents: equal for copies of one save, different
    for another save of the same step (an earlier attempt's, left on one node). It reads little:
    each record of a step file carries the CRC-32 of its bytes in the zip's directory (which
    load_checkpoint_file checked against them), and a sharded folder's DCP `.metadata` names
    its save (a uuid) and where each shard lies, beside its trainer_state.pt. A file without
    CRC-32s (torch's pre-1.6 format, or torch.save with them turned off) is hashed whole.
    """
    path = Path(path)
    digest = hashlib.sha256()
    if path.suffix == ".dcp":
        digest.update((path / ".metadata").read_bytes())
        path = path / TRAINER_STATE
    try:
        with zipfile.ZipFile(path) as archive:
            records = [(r.filename, r.CRC, r.file_size) for r in archive.infolist()]
    except zipfile.BadZipFile:
        records = []
    if records and all(crc or not size for _, crc, size in records):
        digest.update(repr(records).encode())
    else:
        with path.open("rb") as file:  # hashlib.file_digest is Python 3.11+
            while chunk := file.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()[:12]


def _step_of(path: Path) -> float:
    """Return checkpoint_step(path); infinity for a file of another name (then every step file
    counts as older).
    """
    step = checkpoint_step(path)
    return math.inf if step is None else step


def capture_rng_state() -> dict[str, Any]:
    """Return Python, NumPy, torch CPU and CUDA RNG states in a form torch.load(weights_only=True)
    accepts.
    """
    # NumPy's legacy state holds an ndarray, which weights_only loading refuses; store it as a
    # tensor.
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _numpy_state(saved: Any) -> tuple:
    """Return NumPy's legacy RNG state tuple from our layout or 2.0's (the tuple itself)."""
    if isinstance(saved, tuple):  # a 2.0 checkpoint: np.random.get_state() as it was
        return saved
    keys = saved["keys"].numpy().astype(np.uint32)
    return (saved["kind"], keys, saved["pos"], saved["has_gauss"], saved["cached_gaussian"])


def restore_rng_state(state: dict[str, Any] | None) -> None:
    """Restore RNG states captured by capture_rng_state (or by 2.0); missing parts are left
    untouched.
    """
    if not state:
        return
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        np.random.set_state(_numpy_state(state["numpy"]))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"][: torch.cuda.device_count()]
        for index, cuda_state in enumerate(cuda_states):
            torch.cuda.set_rng_state(cuda_state, index)


__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "atomic_json_dump",
    "atomic_torch_save",
    "capture_rng_state",
    "checkpoint_digest",
    "checkpoint_step",
    "restore_rng_state",
]
