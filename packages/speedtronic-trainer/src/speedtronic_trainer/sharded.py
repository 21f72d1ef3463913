"""Sharded checkpoints of FSDP2 models through torch.distributed.checkpoint (DCP).

Every rank writes its own shards of the model and optimizer state; DCP's metadata file, written
once all ranks finished, makes the folder complete. A sharded checkpoint loads at any world size
(DCP reshards), into an FSDP2 model or a plain one; a single-file checkpoint (one process or DDP)
loads into an FSDP2 model too, each rank keeping its shards of the whole state it read.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from speedtronic_trainer.checkpoint_checks import CheckpointError

# The file beside the shards holding everything that is not a tensor shard: counters, schedule,
# per-rank RNG and data positions, the redacted config.
TRAINER_STATE = "trainer_state.pt"


def leaf_optimizers(optimizer: torch.optim.Optimizer) -> list[torch.optim.Optimizer]:
    """Return the plain torch optimizers under a facade (hybrid Muon, cautious), or [optimizer]."""
    leaves = getattr(optimizer, "leaf_optimizers", None)
    return leaves() if callable(leaves) else [optimizer]


def save_sharded(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Write this rank's shards of the model and optimizer state under `path` (every rank calls).
    A failed write raises OSError on every rank alike: DCP gathers every rank's failure, and the
    first OSError among them (a full or unwritable disk) says why, else the first rank's failure.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, leaf_optimizers(optimizer))
    try:
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(path))
    except CheckpointException as error:  # a BaseException, holding each failed rank's error
        causes = [error.failures[rank][0] for rank in sorted(error.failures)]
        found = next((cause for cause in causes if isinstance(cause, OSError)), None)
        if found is None:
            cause = causes[0] if causes else error
            reason = next((line for line in str(cause).splitlines() if line.strip()), "")
            found = OSError(None, f"{type(cause).__name__}: {reason}")
        raise found from error


def damaged_shards(path: Path) -> str | None:
    """Return what is missing or cut short among the files a sharded checkpoint's .metadata
    points to, or None when every byte is there (file sizes only: no shard is read).
    """
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(str(path)).read_metadata()
    except Exception as error:  # a torn .metadata fails as a pickle, EOF or attribute error
        return f"its .metadata is unreadable ({type(error).__name__})"
    ends: dict[str, int] = {}
    for info in metadata.storage_data.values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(ends.items()):
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size < end:
            return f"{name} holds {file.stat().st_size} bytes of {end}"
    return None


def sharded_model_weights(path: Path) -> dict[str, torch.Tensor | None]:
    """Return the model weights a sharded checkpoint holds as meta tensors (names, whole shapes
    and dtypes from its .metadata; no shard is read), to check them against a model before
    loading, and None for each non-tensor entry (a module's get_extra_state()); CheckpointError
    when the .metadata is unreadable.
    """
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    try:
        metadata = FileSystemReader(str(path)).read_metadata()
    except Exception as error:  # a torn .metadata fails as a pickle, EOF or attribute error
        raise CheckpointError(
            f"sharded checkpoint {path} has an unreadable .metadata ({type(error).__name__})"
        ) from error
    # DCP flattens a nested value (an extra state dict) into keys of its own: planner_data maps
    # each key back to its path, ("model", state-dict key, ...).
    paths = metadata.planner_data or {}
    weights: dict[str, torch.Tensor | None] = {}
    for key, entry in metadata.state_dict_metadata.items():
        path_in_state = paths.get(key, tuple(key.split(".", 1)))
        if len(path_in_state) < 2 or path_in_state[0] != "model":
            continue
        tensor = isinstance(entry, TensorStorageMetadata) and len(path_in_state) == 2
        weights[path_in_state[1]] = (
            torch.empty(entry.size, dtype=entry.properties.dtype, device="meta") if tensor else None
        )
    return weights


def load_sharded(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    """Load a sharded checkpoint into `model` (and `optimizer`), resharding to this world size;
    CheckpointError in one line when DCP cannot read it.
    """
    from torch.distributed.checkpoint import CheckpointException

    try:
        _load_sharded(path, model, optimizer)
    except (Exception, CheckpointException) as error:  # DCP's is a BaseException
        # DCP wraps every rank's failure, with its traceback, in one exception: name the first
        # rank's (a damaged shard whose size still matched, a key another model lacks).
        failures = getattr(error, "failures", None)
        cause = next(iter(failures.values()))[0] if failures else error
        reason = next((line for line in str(cause).splitlines() if line.strip()), "")
        reason = reason.split(". ")[0]  # torch's unpickling errors go on to advice that misleads
        raise CheckpointError(
            f"sharded checkpoint {path} could not be loaded ({type(cause).__name__}: {reason}); "
            "move it out of the checkpoints folder to resume from an older one"
        ) from error


def _load_sharded(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )
    from torch.distributed.tensor import DTensor

    if optimizer is None:
        state = {"model": get_model_state_dict(model)}
        # A plain model reads every shard in this process, even inside a process group (rank 0's
        # end-of-run sample, its peers gone); an FSDP2 model's ranks load their shards together.
        alone = not any(isinstance(value, DTensor) for value in state["model"].values())
        _dcp_load(state, path, alone=alone)
        set_model_state_dict(model, state["model"])
        return
    optimizers = leaf_optimizers(optimizer)
    # get_state_dict creates the optimizer state first (a zero-learning-rate step), so every
    # entry the checkpoint holds has a place to load into.
    model_state, optimizer_state = get_state_dict(model, optimizers)
    state: dict[str, Any] = {"model": model_state, "optimizer": optimizer_state}
    _dcp_load(state, path, alone=not torch.distributed.is_initialized())  # a one-process resume
    set_state_dict(
        model,
        optimizers,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
    )


def _dcp_load(state: dict[str, Any], path: Path, *, alone: bool) -> None:
    """dcp.load `state` from `path`; `alone`: in this process only, without a process group."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        # DCP warns that it "assumes" a single process even when asked for one (no_dist).
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(state, checkpoint_id=str(path), no_dist=alone)


def load_full_model_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a whole (unsharded) model state dict, read by every rank, into an FSDP2 model."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))


def shard_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Turn whole optimizer state tensors, loaded by every rank from a single-file checkpoint,
    into this rank's shards: laid out like the FSDP2 (DTensor) parameter each belongs to.
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    for leaf in leaf_optimizers(optimizer):
        for param, entries in leaf.state.items():
            for key, value in entries.items():
                # Per-element state of a sharded parameter; scalars such as step stay whole.
                whole = isinstance(value, torch.Tensor) and not isinstance(value, DTensor)
                if isinstance(param, DTensor) and whole and value.shape == param.shape:
                    # Every rank holds the same whole tensor: slice locally, no collective.
                    entries[key] = distribute_tensor(
                        value, param.device_mesh, param.placements, src_data_rank=None
                    )


__all__ = [
    "TRAINER_STATE",
    "leaf_optimizers",
    "load_full_model_state",
    "load_sharded",
    "save_sharded",
    "shard_optimizer_state",
]
