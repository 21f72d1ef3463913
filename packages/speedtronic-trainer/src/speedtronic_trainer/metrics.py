"""Per-step training metrics: throughput, model FLOPs utilization and memory."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from speedtronic_systems.precision import (
    PrecisionPlan,
    datasheet_peak_flops,
    device_peak_flops,
)


def memory_usage_bytes() -> int | None:
    """Return allocated accelerator memory when the backend exposes it."""
    if torch.cuda.is_available():
        return int(torch.cuda.memory_allocated())
    mps = getattr(torch, "mps", None)
    if mps is not None and torch.backends.mps.is_available():
        return int(mps.current_allocated_memory())
    return None


def model_flops_per_token(model: Any) -> float | None:
    """Return the model's training FLOPs per token from its flops_per_token() method, or None."""
    method = getattr(model, "flops_per_token", None)
    if not callable(method):
        return None
    try:
        value = float(method())
    except Exception:  # MFU is a nicety; a model whose estimate fails still trains
        return None
    return value if value > 0 else None


def adamw_branch_lr(optimizer: Any) -> float | None:
    """Return the AdamW branch's current rate of a hybrid Muon optimizer (cautious-wrapped too),
    or None for any other optimizer; `param_groups[0]` is then Muon's.
    """
    hybrid = getattr(optimizer, "base", optimizer)
    children = getattr(hybrid, "children", None)
    if not isinstance(children, Mapping) or not {"muon", "adamw"} <= set(children):
        return None
    return float(children["adamw"].param_groups[0]["lr"])


class StepMetrics:
    """Build the train_step record over the logging interval: the label-weighted mean loss,
    tokens/s and samples/s of every step since the last record, the last step's loss, grad norm
    and lr, MFU and memory.
    """

    def __init__(
        self, model: Any, device: torch.device, precision: PrecisionPlan, world_size: int = 1
    ) -> None:
        self.flops_per_token = model_flops_per_token(model)
        peak = device_peak_flops(device, precision.dtype) if self.flops_per_token else None
        # tokens/s counts every rank's tokens, so the peak is every rank's device together.
        self.peak_flops = peak * world_size if peak else None
        # A datasheet peak gives MFU; a measured matmul probe (CPUs, unknown GPUs) gives a
        # utilization relative to that probe, named so nobody mistakes it for MFU.
        datasheet = datasheet_peak_flops(device, precision.dtype)
        self.utilization_key = "mfu" if datasheet is not None else "mfu_vs_matmul_probe"
        self._interval = _Interval()

    def add(
        self, *, loss: float, samples: int, tokens: int, seconds: float, labels: int | None = None
    ) -> None:
        """Count one applied step into the current logging interval; its loss weighs by its valid
        labels (the tokens its loss is the mean over), or by its input tokens without labels.
        """
        self._interval.add(loss, samples, tokens, seconds, tokens if labels is None else labels)

    def state_dict(self) -> dict[str, Any]:
        """Return the sums of the steps since the last record: a checkpoint mid-interval keeps
        them, so the first record after a resume averages the same steps an uninterrupted run's
        does.
        """
        return dict(vars(self._interval))

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Restore the interval state_dict returned; None (a checkpoint without it) starts a new
        interval.
        """
        self._interval = _Interval()
        for name, value in (state or {}).items():
            if hasattr(self._interval, name):
                setattr(self._interval, name, type(getattr(self._interval, name))(value))

    def record(
        self,
        *,
        step: int,
        loss: float,
        lr: float,
        grad_norm: float | None,
        lr_adamw: float | None = None,
    ) -> dict[str, Any]:
        """Return the interval's metrics (`loss` is the last step's) and start a new interval;
        `lr_adamw`, Muon's AdamW-branch rate, is recorded when it differs from `lr`.
        """
        interval, self._interval = self._interval, _Interval()
        seconds = interval.seconds
        tokens_per_s = interval.tokens / seconds if seconds > 0 else 0.0
        record: dict[str, Any] = {
            "step": step,
            "loss": interval.mean_loss(loss),
            "loss_last": loss,
            "lr": float(lr),
            **({} if lr_adamw is None or lr_adamw == lr else {"lr_adamw": float(lr_adamw)}),
            "tokens_per_s": tokens_per_s,
            "samples_per_s": interval.samples / seconds if seconds > 0 else 0.0,
            "step_time_s": seconds / max(interval.steps, 1),
        }
        if grad_norm is not None:
            record["grad_norm"] = grad_norm
        if self.flops_per_token and self.peak_flops:
            record[self.utilization_key] = self.flops_per_token * tokens_per_s / self.peak_flops
        memory = memory_usage_bytes()
        if memory is not None:
            record["memory_bytes"] = memory
        return record


class _Interval:
    """Sums over the steps since the last train_step record."""

    def __init__(self) -> None:
        self.steps = self.samples = self.tokens = self.weight = 0
        self.seconds = self.weighted_loss = 0.0

    def add(self, loss: float, samples: int, tokens: int, seconds: float, weight: int) -> None:
        self.steps += 1
        self.samples += samples
        self.tokens += tokens
        self.seconds += seconds
        self.weight += weight
        self.weighted_loss += loss * weight

    def mean_loss(self, fallback: float) -> float:
        """Return the interval's mean loss over its valid labels (fallback without any)."""
        return self.weighted_loss / self.weight if self.weight else fallback


__all__ = ["StepMetrics", "memory_usage_bytes", "model_flops_per_token"]
