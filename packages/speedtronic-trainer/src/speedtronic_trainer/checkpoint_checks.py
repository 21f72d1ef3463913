"""Read checkpoint files and restore them, turning every bad or mismatched checkpoint into one line
that names the file and the fix (torch's own messages span up to 22 lines, and for a refused
pickle suggest loading it unsafely, which we never do).
"""

from __future__ import annotations

import errno
import re
import warnings
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from speedtronic_config import ModelConfig
from speedtronic_config.tokenizer_identity import describe_apart, encode_alike
from speedtronic_systems.parallel import model_class_name

# 2.0 pickled NumPy's RNG state (a tuple holding a uint32 ndarray). weights_only loading stays on;
# it admits exactly the types that array needs, under the names NumPy 1 and NumPy 2 pickle them.
_RECONSTRUCT = (getattr(np, "_core", None) or np.core).multiarray._reconstruct  # NumPy 2, or 1
_NUMPY_RNG_GLOBALS = [
    (_RECONSTRUCT, "numpy.core.multiarray._reconstruct"),
    (_RECONSTRUCT, "numpy._core.multiarray._reconstruct"),
    np.ndarray,
    np.dtype,
    type(np.dtype(np.uint32)),
]


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, truncated, corrupt or not loadable with weights_only=True."""


class CheckpointMismatch(CheckpointError):
    """A checkpoint that loads but was written with other model or optimizer settings than this
    run's: the user's settings to fix, not a damaged file.
    """


# What a refused or torn file's torch error says, as (pattern in torch's message, our words).
_REFUSED = re.compile(
    r"(?:WeightsUnpickler error: |Trying to load )(?:\s*)(unsupported [^\n]*|Unsupported [^\n]*)"
)
_ZIP = re.compile(r"PytorchStreamReader failed [^:]*: ([^.\n]+)")


def describe_load_error(error: BaseException) -> str:
    """Return what is wrong with a file torch.load refused, in a few words on one line."""
    text = str(error)
    refused = _REFUSED.search(text)
    if refused or "Weights only load failed" in text:
        detail = refused.group(1).split(" was not an allowed global")[0] if refused else ""
        detail = detail.rstrip(". ")
        # A Speedtronic checkpoint holds tensors and plain containers only: anything else is
        # foreign or tampered with, and must not be unpickled.
        return "is corrupt or holds pickled objects a Speedtronic checkpoint never contains" + (
            f" ({detail[:160]})" if detail else ""
        )
    torn = _ZIP.search(text)
    if torn:
        return f"is truncated or corrupt ({torn.group(1).strip()})"
    if isinstance(error, OSError) and error.errno == errno.EINVAL:
        # What torch's zip reader raises for a file cut short at many lengths: alone, the line
        # would read like a failing disk, not like the damaged file it is.
        return "is truncated or corrupt (torch's zip reader: Invalid argument)"
    if isinstance(error, EOFError):
        return "is empty or truncated"
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"is not a readable checkpoint ({type(error).__name__}{': ' if first else ''}{first})"[
        :240
    ]


RESUME_HINT = "delete it to resume from an older checkpoint"


def _load_mapped(path: Path) -> Any:
    """torch.load the file memory-mapped: its tensors are the page cache's, shared by every rank
    on the machine that reads it (each DDP/FSDP2 rank reads a whole single-file checkpoint),
    instead of one private copy per rank. A file torch cannot map (the pre-1.6 format) is read.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as exc:
        if "mmap" not in str(exc):
            raise  # a bad file: reported once, not read a second time
        return torch.load(path, map_location="cpu", weights_only=True)


def _failed_crc_record(path: Path) -> str | None:
    """Return the first record of a torch.save zip file whose bytes fail the CRC-32 torch.save
    recorded for it, else None. torch.load never checks them (a mapped load does not even read
    the bytes), so a bit flipped on disk inside a tensor would load as a damaged weight.

    Reads the whole file once, as restoring its tensors does anyway (about 2 GB/s on the
    development machine). A record with CRC 0 is skipped: torch.save writes 0 for every record
    under torch.serialization.set_crc32_options(False). A file zipfile cannot open is torch's
    pre-1.6 format, which records none.
    """
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        return None
    with archive:
        for record in archive.infolist():
            if record.CRC == 0:
                continue
            try:
                with archive.open(record) as stream:
                    while stream.read(1 << 24):
                        pass
            except zipfile.BadZipFile:  # a bad CRC, or a damaged record header
                return record.filename
    return None


def load_checkpoint_file(path: str | Path, hint: str | None = RESUME_HINT) -> dict[str, Any]:
    """Load one checkpoint with weights_only=True; a bad file (damaged anywhere: its records'
    CRC-32 are checked) is a one-line CheckpointError.

    The line ends with `hint` when one is given.
    """
    path = Path(path)
    advice = f"; {hint}" if hint else ""
    try:
        with warnings.catch_warnings():
            # e.g. "Detected pickle protocol 4": a Python-warning block on stderr, before our line.
            warnings.simplefilter("ignore")
            with torch.serialization.safe_globals(_NUMPY_RNG_GLOBALS):
                state = _load_mapped(path)
        failed = _failed_crc_record(path)
    except FileNotFoundError as exc:
        raise CheckpointError(f"checkpoint {path} does not exist") from exc
    except IsADirectoryError as exc:
        raise CheckpointError(f"checkpoint {path} is a folder, not a checkpoint file") from exc
    except Exception as exc:  # torch raises RuntimeError, EOFError, UnpicklingError, zip errors...
        raise CheckpointError(f"checkpoint {path} {describe_load_error(exc)}{advice}") from exc
    if failed is not None:
        raise CheckpointError(
            f"checkpoint {path} is corrupt ({failed} fails the CRC-32 check torch.save recorded "
            f"for it: its bytes changed after it was written){advice}"
        )
    if not isinstance(state, dict):
        raise CheckpointError(
            f"checkpoint {path} holds a {type(state).__name__}, expected a state dict"
        )
    return state


def _shape(value: Any) -> str:
    return str(list(value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__


def _config_differences(saved: Any, current: Any, section: str) -> list[tuple[str, Any, Any]]:
    """Return (field, checkpoint value, this run's value) for each field of `section` the
    checkpoint's saved config and this run's disagree on (fields either lacks are skipped).
    """
    if not isinstance(saved, Mapping) or current is None:
        return []
    theirs = saved.get(section)
    ours = current.to_dict().get(section) if hasattr(current, "to_dict") else None
    if not isinstance(theirs, Mapping) or not isinstance(ours, Mapping):
        return []
    return [
        (name, theirs[name], ours[name])
        for name in ours
        if name in theirs and theirs[name] != ours[name]
    ]


def _describe(section: str, differences: list[tuple[str, Any, Any]]) -> str:
    return "; ".join(
        f"{section}.{name}: checkpoint {theirs!r}, this run {ours!r}"
        for name, theirs, ours in differences[:4]
    )


def check_settings(state: Mapping[str, Any], config: Any) -> None:
    """Raise CheckpointMismatch, before anything is loaded, when the checkpoint was written with
    another model (any model setting but ModelConfig.RESUMABLE) or another optimizer than this
    run's `config` (None: nothing to compare). A sharded checkpoint loads only the keys the model
    asks for, and equal shapes (n_head) load without complaint: the weights would train on as
    another model.
    """
    model = [
        difference
        for difference in _config_differences(state.get("config"), config, "model")
        if difference[0] not in ModelConfig.RESUMABLE
    ]
    if model:
        raise CheckpointMismatch(
            f"checkpoint {_where(state)} was written with other model settings "
            f"({_describe('model', model)}); resume with the model settings it was written "
            "with, or start a new run in another run.output_dir"
        )
    _check_optimizer_name(state, config)


def weight_misfits(model: torch.nn.Module, weights: Mapping[str, Any]) -> list[str]:
    """Return, one short phrase each, every way `weights` (a model state dict) does not fit
    `model`: shape mismatches, then missing and unexpected names; empty when it loads strictly.
    """
    current = model.state_dict()
    problems = [
        f"size mismatch for {name}: checkpoint {_shape(weights[name])}, model {_shape(value)}"
        for name, value in current.items()
        # Two non-tensors (a module's extra state; a sharded checkpoint's is not read) have no size.
        if name in weights
        and (isinstance(weights[name], torch.Tensor) or isinstance(value, torch.Tensor))
        and _shape(weights[name]) != _shape(value)
    ]
    problems += [f"missing {name}" for name in current if name not in weights]
    return problems + [f"unexpected {name}" for name in weights if name not in current]


def describe_misfits(problems: list[str]) -> str:
    """Return the first of `problems` and how many more there are."""
    return problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")


def check_model_fits(model: torch.nn.Module, state: Mapping[str, Any], config: Any = None) -> None:
    """Raise CheckpointMismatch naming the first mismatch between a checkpoint's weights and
    `model`, how many there are, and the model settings that differ; load nothing.
    """
    problems = weight_misfits(model, state["model"])
    if not problems:
        return
    settings = _config_differences(state.get("config"), config, "model")
    held, ours = state.get("model_class"), model_class_name(model)
    if held is not None and held != ours:  # 2.0 checkpoints record no class
        fix = f"it holds a {held}'s weights, this run's model is a {ours}: resume with that model"
    else:
        fix = "resume with the model settings it was written with"
        if settings:
            written = _describe("model", settings)
            fix = f"the checkpoint was written with other model settings ({written}): {fix}"
    raise CheckpointMismatch(
        f"checkpoint {_where(state)} does not fit this model: {describe_misfits(problems)}; "
        f"{fix}, or start a new run in another run.output_dir"
    )


def restore_model(
    model: torch.nn.Module,
    state: Mapping[str, Any],
    config: Any = None,
    load: Callable[[torch.nn.Module, Any], Any] | None = None,
) -> None:
    """Load a checkpoint's model weights strictly (through `load(model, weights)` when given, as
    an FSDP2 model needs) once check_model_fits passes.
    """
    check_model_fits(model, state, config)
    (load or torch.nn.Module.load_state_dict)(model, state["model"])


def restore_optimizer(optimizer: Any, state: Mapping[str, Any], config: Any = None) -> None:
    """Load a checkpoint's optimizer state; CheckpointError naming both optimizers and the fix when
    it was written by another one (Muon state is not interchangeable with AdamW state).
    """
    _check_optimizer_name(state, config)
    # torch loads another optimizer's state when the group and parameter counts agree (an Adam
    # checkpoint into SGD): the groups then lack this optimizer's hyperparameters and its first
    # step fails with a bare KeyError. What each group needs is what it held before the load.
    needed = [set(group) for group in group_settings(optimizer)]
    before = optimizer.state_dict()  # what a refusal puts back: the optimizer stays usable
    try:
        optimizer.load_state_dict(state["optimizer"])
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        optimizer.load_state_dict(before)
        found = _layout(state["optimizer"])
        first = next(iter(str(exc).splitlines()), "")
        raise CheckpointMismatch(
            f"checkpoint {_where(state)} holds {found} optimizer state that this run's "
            f"{type(optimizer).__name__} cannot load ({type(exc).__name__}: {first[:160]}); "
            "resume with the optimizer settings it was written with, or start a new run in "
            "another run.output_dir"
        ) from exc
    # torch has checked that the group counts agree
    groups = list(zip(needed, [set(g) for g in group_settings(optimizer)], strict=True))
    lacking = sorted({key for want, got in groups for key in want - got})
    if lacking:
        optimizer.load_state_dict(before)
        foreign = sorted({key for want, got in groups for key in got - want})
        raise CheckpointMismatch(
            f"checkpoint {_where(state)} holds the state of another optimizer than this run's "
            f"{type(optimizer).__name__} (its parameter groups lack {', '.join(lacking)}"
            + (f" and have {', '.join(foreign)}" if foreign else "")
            + "); resume with the optimizer it was written with, or start a new run in another "
            "run.output_dir"
        )


# Param-group entries that are not settings a resume could change or lack: the parameters (and
# the names torch >= 2.6 may record), the learning rate (the schedule's: an LR scheduler adds
# initial_lr) and kernel choices torch fills in and may vary.
_NOT_SETTINGS = frozenset(
    {
        "params",
        "param_names",
        "lr",
        "initial_lr",
        "foreach",
        "fused",
        "capturable",
        "differentiable",
    }
)


def group_settings(optimizer: Any) -> list[dict[str, Any]]:
    """Return each parameter group's hyperparameters (no parameters, no learning rate)."""
    return [
        {key: value for key, value in group.items() if key not in _NOT_SETTINGS}
        for group in optimizer.param_groups
    ]


def _check_optimizer_name(state: Mapping[str, Any], config: Any) -> None:
    """Raise CheckpointMismatch naming both optimizers when the checkpoint was written by another
    one (Muon state is not interchangeable with AdamW state).
    """
    theirs = _optimizer_name(state.get("config"))
    ours = getattr(getattr(config, "optimizer", None), "name", None)
    if theirs is not None and ours is not None and theirs != ours:
        raise CheckpointMismatch(
            f"checkpoint {_where(state)} was written with optimizer.name: {theirs}, but this run "
            f"uses optimizer.name: {ours}; their states are not interchangeable: resume with "
            f"--set optimizer.name={theirs}, or start a new run in another run.output_dir"
        )


def check_tokenizer(state: Mapping[str, Any], identity: Mapping[str, Any] | None) -> None:
    """Raise CheckpointMismatch when the checkpoint was trained on tokens of another tokenizer
    than this run's data (`identity`, as the checkpoint records it); a checkpoint that records
    none (written before the record existed) or a run that knows none is not checked.
    """
    saved = state.get("tokenizer")
    if not isinstance(saved, Mapping) or identity is None:
        return
    if encode_alike(saved, identity):
        return
    saved_text, ours_text = describe_apart(saved, identity)
    raise CheckpointMismatch(
        f"checkpoint {_where(state)} was trained on tokens of {saved_text}, but "
        f"this run's data holds tokens of {ours_text}; prepare the data with "
        "the checkpoint's tokenizer, or start a new run in another run.output_dir (to keep these "
        "weights: export them with --format hf and set model.init_from: hf:DIR)"
    )


def _optimizer_name(saved_config: Any) -> str | None:
    section = saved_config.get("optimizer") if isinstance(saved_config, Mapping) else None
    name = section.get("name") if isinstance(section, Mapping) else None
    return name if isinstance(name, str) else None


def _layout(optimizer_state: Any) -> str:
    """Return which optimizer wrote a state dict, as far as its keys tell."""
    if isinstance(optimizer_state, Mapping) and "muon" in optimizer_state:
        return "Muon (hybrid)"
    if isinstance(optimizer_state, Mapping) and "param_groups" in optimizer_state:
        return "single-optimizer (AdamW-style)"
    return "unrecognized"


def _where(state: Mapping[str, Any]) -> str:
    return str(state.get("checkpoint_path", "state"))


__all__ = [
    "CheckpointError",
    "CheckpointMismatch",
    "check_model_fits",
    "check_settings",
    "check_tokenizer",
    "describe_load_error",
    "describe_misfits",
    "group_settings",
    "load_checkpoint_file",
    "restore_model",
    "restore_optimizer",
    "weight_misfits",
]
