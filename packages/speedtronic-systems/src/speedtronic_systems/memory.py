"""Estimate a run's memory from its config, before anything is allocated, and refuse what cannot
fit the device.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from speedtronic_config import ConfigError, ModelConfig, resolve_section
from speedtronic_config.errors import first_refusal, on_every_rank
from speedtronic_systems.parallel import SINGLE, ParallelContext

FP32_BYTES = 4
TOKEN_BYTES = 8  # batches hold int64 input ids and labels
# cgroup v2, then v1: a container's limit is lower than the machine's RAM it reports.
_CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
)


@dataclass(frozen=True)
class MemoryEstimate:
    """A run's memory by kind, in bytes: a rough lower bound, so a refusal is never a close call."""

    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    batches: int

    @property
    def total(self) -> int:
        """Return the sum of every kind."""
        return (
            self.parameters
            + self.gradients
            + self.optimizer_state
            + self.activations
            + self.batches
        )

    def describe(self) -> str:
        """Return the total and its parts, e.g. `1.2 TB (parameters 300 GB, ...)`."""
        parts = ", ".join(
            f"{name} {format_bytes(value)}"
            for name, value in (
                ("parameters", self.parameters),
                ("gradients", self.gradients),
                ("optimizer state", self.optimizer_state),
                ("activations", self.activations),
                ("batches", self.batches),
            )
            if value
        )
        return f"{format_bytes(self.total)} ({parts})"


def format_bytes(size: float) -> str:
    """Return a byte count in decimal units: 512 B, 3.4 MB, 1.2 TB."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if size < 1000 or unit == "PB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def reference_parameter_count(model: Any) -> tuple[int, int]:
    """Return (all, embedding and head) parameter counts of the reference transformer a
    ModelConfig describes, without building it.
    """
    section = resolve_section(model, "model")
    d, d_ff, vocab = section.d_model, section.d_ff, section.vocab_size
    kv_width = section.n_kv_head * (d // section.n_head)
    per_layer = 2 * d + 2 * d * d + 2 * d * kv_width + 3 * d * d_ff  # norms, q/o, k/v, SwiGLU
    embeddings = vocab * d * (1 if section.tie_weights else 2)
    return section.n_layer * per_layer + d + embeddings, embeddings


def estimate_training_memory(config: Any) -> MemoryEstimate:
    """Return the memory a whole config's run needs at least, per process: the reference model's
    parameters, gradients, optimizer state and activations (zero for a registered custom model,
    whose size is unknown until it is built), plus the micro-batches one optimizer step holds.
    Under FSDP2 each of WORLD_SIZE processes holds its share of the first three.
    """
    model = resolve_section(config, "model")
    data = resolve_section(config, "data")
    optimizer = resolve_section(config, "optimizer")
    precision = resolve_section(config, "precision")
    block = data.block_size if data.block_size is not None else model.max_seq_len
    tokens = data.micro_batch_size * block
    # One step draws every micro-batch before the first forward.
    batches = data.accumulation_steps * tokens * 2 * TOKEN_BYTES
    if model.name not in ModelConfig.REFERENCE_NAMES:
        return MemoryEstimate(0, 0, 0, 0, batches)
    count, embeddings = reference_parameter_count(model)
    # AdamW keeps two moments per parameter; Muon one momentum per hidden matrix (the embeddings,
    # head and norms stay on AdamW).
    states = 2 * count if optimizer.name == "adamw" else count + embeddings
    act_bytes = FP32_BYTES if precision.mode == "fp32" else 2
    checkpointed = model.gradient_checkpointing  # the config keeps it equal to the root flag
    # Saved for backward per token and layer: the block input, norms, q/k/v, attention output and
    # the SwiGLU gate/up/product: about 8 * d_model + 3 * d_ff values (only the block input when
    # activations are recomputed). The logits and their gradient are fp32 either way: for every
    # token, or for one chunk of rows with the chunked head (model.loss_chunk_size).
    per_layer = model.d_model if checkpointed else 8 * model.d_model + 3 * model.d_ff
    chunk = model.loss_chunk_size
    logit_rows = tokens if chunk is None else min(chunk, tokens)
    activations = (
        tokens * model.n_layer * per_layer * act_bytes
        + logit_rows * 2 * model.vocab_size * FP32_BYTES
    )
    # FSDP2 shards them over the ranks (the model is sharded because it does not fit one device).
    sharded = resolve_section(config, "parallel").data_parallel == "fsdp"
    shards = max(1, int(os.environ.get("WORLD_SIZE", "1"))) if sharded else 1
    return MemoryEstimate(
        parameters=count * FP32_BYTES // shards,
        gradients=count * FP32_BYTES // shards,
        optimizer_state=states * FP32_BYTES // shards,
        activations=activations,
        batches=batches,
    )


def device_memory(device: torch.device | str) -> tuple[int, str] | None:
    """Return (bytes, what they are) a device can hold at most, or None when unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        name = torch.cuda.get_device_name(index)
        return torch.cuda.get_device_properties(index).total_memory, f"{device} ({name})"
    # CPU, and MPS's unified memory: the machine's RAM, or the container's limit when lower.
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    limit = _cgroup_limit()
    if limit is not None and limit < ram:
        return limit, f"{device.type} (container memory limit)"
    return ram, f"{device.type} (RAM)"


def _cgroup_limit() -> int | None:
    for path in _CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text)
    return None


def check_training_memory(
    config: Any, device: torch.device | str, group: ParallelContext = SINGLE
) -> MemoryEstimate:
    """Return the run's memory estimate; raise ConfigError, with the estimate and the limit, when
    it exceeds what the device holds (unless run.memory_check is false). Every rank of `group`
    must call it: when any rank's device is too small, every rank raises the same error.
    """
    estimate = estimate_training_memory(config)
    if not resolve_section(config, "run").memory_check:
        return estimate
    # Ranks can differ (GPUs of different sizes, nodes with different RAM or container limits):
    # a rank refusing alone would leave its peers waiting for it in their next collective.
    refusal = first_refusal(group.all_gather_object(_shortfall(estimate, device)))
    if refusal is None:
        return estimate
    (problem, allowed), where = refusal
    raise on_every_rank(ConfigError("", where + problem, allowed=allowed))


def _shortfall(estimate: MemoryEstimate, device: torch.device | str) -> tuple[str, str] | None:
    """Return (the problem, how to fix it) when `estimate` exceeds what this process may use of
    `device`, else None (also when that is unknown).
    """
    available = device_memory(device)
    if available is None:
        return None
    limit, what = available
    has = format_bytes(limit)
    # Each CUDA process has a GPU of its own; every other device draws on the machine's one RAM,
    # which the LOCAL_WORLD_SIZE processes torchrun started on it share.
    local = 1 if torch.device(device).type == "cuda" else _local_processes()
    if local > 1:
        limit //= local
        has += f" shared by {local} processes on this machine ({format_bytes(limit)} each)"
    if estimate.total <= limit:
        return None
    fewer = ", or fewer processes (--nproc-per-node)" if local > 1 else ""
    return (
        f"this run needs at least {estimate.describe()} of memory, but {what} has {has}",
        "lower model.n_layer, model.d_model, model.vocab_size or "
        f"data.micro_batch_size{fewer} (or set run.memory_check: false if the estimate is wrong)",
    )


def _local_processes() -> int:
    """Return how many processes torchrun started on this machine (1 outside torchrun)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


__all__ = [
    "MemoryEstimate",
    "check_training_memory",
    "device_memory",
    "estimate_training_memory",
    "format_bytes",
    "reference_parameter_count",
]
