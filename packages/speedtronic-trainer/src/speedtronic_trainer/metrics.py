"""Per-step training metrics: throughput, model FLOPs utilization and memory."""

from __future__ import annotations

from typing import Any

import torch

from speedtronic_systems.precision import PrecisionPlan, device_peak_flops


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


class StepMetrics:
    """Build the train_step record: loss, lr, grad norm, tokens/s, samples/s, step time, MFU,
    memory.
    """

    def __init__(
        self, model: Any, device: torch.device, precision: PrecisionPlan, world_size: int = 1
    ) -> None:
        self.flops_per_token = model_flops_per_token(model)
        peak = device_peak_flops(device, precision.dtype) if self.flops_per_token else None
        # tokens/s counts every rank's tokens, so the peak is every rank's device together.
        self.peak_flops = peak * world_size if peak else None

    def record(
        self,
        *,
        step: int,
        loss: float,
        lr: float,
        grad_norm: float | None,
        samples: int,
        tokens: int,
        step_time: float,
    ) -> dict[str, Any]:
        """Return the metrics of one optimizer step."""
        tokens_per_s = tokens / step_time if step_time > 0 else 0.0
        record: dict[str, Any] = {
            "step": step,
            "loss": loss,
            "lr": float(lr),
            "tokens_per_s": tokens_per_s,
            "samples_per_s": samples / step_time if step_time > 0 else 0.0,
            "step_time_s": step_time,
        }
        if grad_norm is not None:
            record["grad_norm"] = grad_norm
        if self.flops_per_token and self.peak_flops:
            record["mfu"] = self.flops_per_token * tokens_per_s / self.peak_flops
        memory = memory_usage_bytes()
        if memory is not None:
            record["memory_bytes"] = memory
        return record


__all__ = ["StepMetrics", "memory_usage_bytes", "model_flops_per_token"]
