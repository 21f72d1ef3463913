"""Safetensors helpers, pseudo-gradients and delta naming; nothing here ever unpickles."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import safe_open
from safetensors.torch import load as _load_bytes
from safetensors.torch import save as _save_bytes

from speedtronic_config.atomic import atomic_write_bytes

K = TypeVar("K")  # what identical_deltas groups: the master's (node_id, base outer step)

DELTA_PREFIX = "deltas"
# deltas/<node_id>/step-<local_step>-base-<base_outer_step>.safetensors: every field a delta needs
# to be applied exactly once is in its name, so a retried upload lands on the same path.
_DELTA_RE = re.compile(
    r"^deltas/(?P<node>[A-Za-z0-9_.-]+)/step-(?P<step>\d+)-base-(?P<base>\d+)\.safetensors$"
)
_NODE_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True, order=True)
class DeltaRef:
    """A parsed delta path: who sent it, at which local step, computed against which outer step."""

    node_id: str
    local_step: int
    base_outer_step: int

    @property
    def path(self) -> str:
        """Return the deterministic repository path of this delta."""
        return delta_path(self.node_id, self.local_step, self.base_outer_step)


def check_node_id(node_id: str) -> str:
    """Return node_id when it is path-safe, else raise ValueError saying what is allowed."""
    if not isinstance(node_id, str) or not _NODE_RE.match(node_id) or node_id in {".", ".."}:
        raise ValueError(
            f"distributed.node_id={node_id!r} is not path-safe: use letters, digits, '_', '-' or "
            "'.'"
        )
    return node_id


def delta_path(node_id: str, local_step: int, base_outer_step: int) -> str:
    """Return the deterministic repository path for one node delta."""
    check_node_id(node_id)
    if local_step < 0 or base_outer_step < 0:
        raise ValueError(
            f"delta steps must be >= 0, got local_step={local_step} "
            f"base_outer_step={base_outer_step}"
        )
    return f"{DELTA_PREFIX}/{node_id}/step-{local_step:010d}-base-{base_outer_step:08d}.safetensors"


def parse_delta_ref(path: str) -> DeltaRef | None:
    """Return the DeltaRef encoded in a repository path, or None for any other path."""
    match = _DELTA_RE.match(path)
    if match is None or match["node"] in {".", ".."}:
        return None
    return DeltaRef(match["node"], int(match["step"]), int(match["base"]))


def cpu_tensor(value: torch.Tensor) -> torch.Tensor:
    """Return a detached, contiguous CPU copy that shares no storage with value."""
    return value.detach().to("cpu", copy=True).contiguous()


def cpu_state_dict(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Return an independent CPU copy of every tensor in a state dict (tied weights become
    copies).
    """
    return {
        name: cpu_tensor(value) for name, value in state.items() if isinstance(value, torch.Tensor)
    }


def floating_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Return the floating-point entries only: integer buffers (counters, masks) never get
    deltas.
    """
    return {name: value for name, value in state.items() if torch.is_floating_point(value)}


def save_safetensors(
    state: Mapping[str, torch.Tensor],
    path: str | os.PathLike[str],
    *,
    metadata: dict[str, str] | None = None,
) -> None:
    """Write state as safetensors atomically; tied or shared tensors are stored as separate
    copies.
    """
    atomic_write_bytes(Path(path), to_safetensors_bytes(state, metadata=metadata))


def to_safetensors_bytes(
    state: Mapping[str, torch.Tensor], *, metadata: dict[str, str] | None = None
) -> bytes:
    """Return state serialized as safetensors bytes (shared storage copied apart, as safetensors
    requires).
    """
    return _save_bytes(cpu_state_dict(state), metadata=dict(metadata or {}))


def from_safetensors_bytes(data: bytes) -> dict[str, torch.Tensor]:
    """Return the tensors of a safetensors byte string (never pickle)."""
    return _load_bytes(data)


def load_safetensors(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Return the tensors of a safetensors file on CPU."""
    return from_safetensors_bytes(Path(path).read_bytes())


def read_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """Return the string metadata stored in a safetensors header."""
    with safe_open(str(path), framework="pt") as handle:
        return dict(handle.metadata() or {})


def load_delta(path: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Return (tensors, header metadata) of a delta file."""
    return load_safetensors(path), read_metadata(path)


def metadata_json(metadata: Mapping[str, str]) -> dict[str, Any]:
    """Return header metadata with JSON-encoded values decoded (plain strings are kept)."""
    decoded: dict[str, Any] = {}
    for key, value in metadata.items():
        try:
            decoded[key] = json.loads(value)
        except (TypeError, ValueError):
            decoded[key] = value
    return decoded


def compute_pseudo_gradient(
    baseline: Mapping[str, torch.Tensor], current: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Compute baseline - current for floating-point state tensors."""
    missing = sorted(set(floating_state(baseline)) - set(current))
    if missing:
        raise KeyError(
            f"current state lacks baseline tensors {missing[:5]}; the model changed shape since "
            "the baseline"
        )
    return {
        name: (cpu_tensor(current[name]).neg_().add_(cpu_tensor(base)))
        for name, base in floating_state(baseline).items()
    }


def identical_deltas(deltas: Mapping[K, Mapping[str, torch.Tensor]]) -> list[list[K]]:
    """Return the groups (two keys or more, in key order) whose deltas are equal tensor for tensor.

    A float64 sum per tensor sorts candidates cheaply; only matching sums are compared in full.
    """
    candidates: dict[tuple, list[K]] = {}
    for key, delta in deltas.items():
        sums = tuple((name, float(delta[name].sum(dtype=torch.float64))) for name in sorted(delta))
        candidates.setdefault(sums, []).append(key)
    groups = []
    for keys in candidates.values():
        while len(keys) > 1:
            first, rest = keys[0], keys[1:]
            same = [k for k in rest if _equal(deltas[first], deltas[k])]
            if same:
                groups.append([first, *same])
            keys = [k for k in rest if k not in same]
    return groups


def _equal(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def average_deltas(deltas: list[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Return the element-wise mean of deltas that share names and shapes (accumulated in
    float32+).
    """
    if not deltas:
        raise ValueError("average_deltas needs at least one delta")
    names = set(deltas[0])
    for index, delta in enumerate(deltas[1:], start=1):
        if set(delta) != names:
            raise ValueError(
                f"delta {index} has different tensor names than delta 0: "
                f"{sorted(names ^ set(delta))[:5]}"
            )
    result = {}
    for name in deltas[0]:
        first = deltas[0][name]
        acc_dtype = torch.promote_types(first.dtype, torch.float32)
        total = torch.zeros(first.shape, dtype=acc_dtype)
        for delta in deltas:
            total.add_(delta[name].to(acc_dtype))
        result[name] = total.div_(len(deltas)).to(first.dtype)
    return result


def delta_problem(
    delta: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]
) -> str | None:
    """Return why a received delta cannot be applied to reference (names, shapes, dtypes,
    finiteness), or None.
    """
    expected = floating_state(reference)
    if set(delta) != set(expected):
        extra, missing = sorted(set(delta) - set(expected)), sorted(set(expected) - set(delta))
        return f"tensor names differ (unexpected {extra[:3]}, missing {missing[:3]})"
    for name, value in delta.items():
        if tuple(value.shape) != tuple(expected[name].shape):
            return f"{name}: shape {tuple(value.shape)} != {tuple(expected[name].shape)}"
        if value.dtype != expected[name].dtype:
            return f"{name}: dtype {value.dtype} != {expected[name].dtype}"
        if not bool(torch.isfinite(value).all()):
            return f"{name}: non-finite values"
    return None


def state_nbytes(state: Mapping[str, torch.Tensor]) -> int:
    """Return the payload size of a state in bytes (what a delta of it weighs on the wire)."""
    return sum(value.numel() * value.element_size() for value in floating_state(state).values())


__all__ = [
    "DELTA_PREFIX",
    "DeltaRef",
    "average_deltas",
    "check_node_id",
    "compute_pseudo_gradient",
    "cpu_state_dict",
    "cpu_tensor",
    "delta_path",
    "delta_problem",
    "floating_state",
    "from_safetensors_bytes",
    "identical_deltas",
    "load_delta",
    "load_safetensors",
    "metadata_json",
    "parse_delta_ref",
    "read_metadata",
    "save_safetensors",
    "state_nbytes",
    "to_safetensors_bytes",
]
