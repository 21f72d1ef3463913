"""Startup shape-efficiency warnings for configured batches and model GEMMs."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from speedtronic_config import ShapeValidationConfig, resolve_section
from speedtronic_systems.precision import PrecisionPlan

_logger = logging.getLogger(__name__)

# Tensor-core friendly widths on CUDA, in elements: 64 16-bit elements are 128 bytes, the tile
# width cuBLAS kernels on A100/H100 run without a remainder; FP32 GEMMs are served well at 8.
_CUDA_ALIGNMENT = {"bf16": 64, "fp16": 64, "fp32": 8}
_MPS_ALIGNMENT = 8
# The batch only ever enters a GEMM multiplied by the sequence length, so asking for a batch of
# 64 would be noise; 8 keeps the rows of small-sequence runs aligned.
_MAX_BATCH_ALIGNMENT = 8


@dataclass(frozen=True)
class ShapeProfile:
    """The alignment a device and precision prefer, and where it came from ("auto", "cpu-auto" or
    "explicit").
    """

    device_type: str
    precision: str
    alignment: int
    source: str


@dataclass(frozen=True)
class ShapeWarning:
    """One configured dimension that is not a multiple of the preferred alignment."""

    code: str
    field: str
    value: int
    suggested: int | None
    alignment: int
    reason: str

    @property
    def message(self) -> str:
        """Return the one-line warning: value, alignment, suggestion and why it matters."""
        hint = f"; suggested {self.suggested}" if self.suggested is not None else ""
        return (
            f"shape: {self.field}={self.value} is not a multiple of {self.alignment}{hint} "
            f"({self.reason})"
        )


@dataclass
class ShapeReport:
    """The profile used and the (deduplicated) warnings of one startup check."""

    profile: ShapeProfile
    warnings: list[ShapeWarning] = field(default_factory=list)

    def warning_count(self) -> int:
        """Return the number of warnings."""
        return len(self.warnings)

    def as_dict(self) -> dict[str, Any]:
        """Return the report as plain data (for logs and run artifacts)."""
        return {
            "profile": asdict(self.profile),
            "warnings": [asdict(w) | {"message": w.message} for w in self.warnings],
            "warning_count": self.warning_count(),
        }


def _settings(section: Any) -> ShapeValidationConfig:
    """Return the shape_validation section; `true`/`false` is shorthand for `enabled`."""
    if isinstance(section, bool):
        return ShapeValidationConfig(enabled=section)
    return resolve_section(section, "shape_validation")


def _suggest(value: int, alignment: int) -> int:
    """Return the multiple of `alignment` nearest to `value` (ties and zero round up)."""
    down = (value // alignment) * alignment
    up = down + alignment
    return down if down > 0 and value - down < up - value else up


def resolve_shape_profile(
    device: torch.device | str,
    precision: PrecisionPlan,
    *,
    requested_alignment: int | str | None = "auto",
) -> ShapeProfile:
    """Return the alignment profile for a device and precision; an explicit positive int overrides
    auto.
    """
    device_type = torch.device(device).type
    if requested_alignment is None or (
        isinstance(requested_alignment, str) and requested_alignment.strip().lower() == "auto"
    ):
        if device_type == "cuda":
            return ShapeProfile(
                device_type, precision.mode, _CUDA_ALIGNMENT[precision.mode], "auto"
            )
        if device_type == "mps":
            return ShapeProfile(device_type, precision.mode, _MPS_ALIGNMENT, "auto")
        # CPU GEMMs have no tile width worth warning about: the auto profile is quiet.
        return ShapeProfile(device_type, precision.mode, 1, "cpu-auto")
    alignment = ShapeValidationConfig(alignment=requested_alignment).alignment
    return ShapeProfile(device_type, precision.mode, alignment, "explicit")


def _append_warning(
    warnings: list[ShapeWarning],
    seen: set[tuple[str, int, int]],
    *,
    code: str,
    name: str,
    value: int,
    alignment: int,
    reason: str,
    suppress_suggestion: bool = False,
    suggested: int | None = None,
) -> None:
    """Add a warning when `value` is misaligned, once per (code, value, alignment)."""
    if alignment <= 1 or value % alignment == 0 or (code, value, alignment) in seen:
        return
    seen.add((code, value, alignment))
    if not suppress_suggestion and suggested is None:
        suggested = _suggest(value, alignment)
    warnings.append(
        ShapeWarning(
            code, name, value, None if suppress_suggestion else suggested, alignment, reason
        )
    )


def _batch_suggestion(micro: int, target: int | None, alignment: int) -> int | None:
    """Return the aligned micro batch nearest `micro` that still divides `target`, or None when none
    exists.
    """
    if not target:
        return _suggest(micro, alignment)
    candidates = [d for d in range(alignment, target + 1, alignment) if target % d == 0]
    return min(candidates, key=lambda d: (abs(d - micro), -d)) if candidates else None


def _module_metadata(model: nn.Module) -> list[tuple[str, int]]:
    """Return (name, width) for the GEMM dimensions of every Linear and Embedding layer in
    `model`.
    """
    dims: list[tuple[str, int]] = []
    for name, module in model.named_modules():
        name = name or "model"  # the root module has an empty name
        if isinstance(module, nn.Linear):
            dims += [
                (f"{name}.in_features", module.in_features),
                (f"{name}.out_features", module.out_features),
            ]
        elif isinstance(module, nn.Embedding):
            dims.append((f"{name}.embedding_dim", module.embedding_dim))
    return dims


def _get(value: Any, name: str) -> Any:
    """Return value's `name` field or key (sections are taken duck-typed: objects or mappings)."""
    if isinstance(value, Mapping):
        return value.get(name)
    return getattr(value, name, None) if value is not None else None


def _int_or_none(section: Any, name: str) -> int | None:
    value = _get(section, name)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _model_dims(model_section: Any) -> list[tuple[str, int]]:
    """Return the configured GEMM widths: d_model, d_ff, head_dim and the grouped K/V width."""
    d_model = _int_or_none(model_section, "d_model")
    d_ff = _int_or_none(model_section, "d_ff")
    n_head = _int_or_none(model_section, "n_head")
    n_kv_head = _int_or_none(model_section, "n_kv_head") or n_head
    dims: list[tuple[str, int]] = []
    if d_model:
        dims.append(("model.d_model", d_model))
    if d_ff:
        dims.append(("model.d_ff", d_ff))
    if d_model and n_head and d_model % n_head == 0:
        head_dim = d_model // n_head
        dims.append(("model.head_dim", head_dim))
        if n_kv_head:
            dims.append(("model.kv_width (n_kv_head * head_dim)", n_kv_head * head_dim))
    return dims


def validate_startup_shapes(
    config: Any,
    model: nn.Module,
    device: torch.device | str,
    precision: PrecisionPlan,
    *,
    logger: Any | None = None,
    world_size: int = 1,
) -> ShapeReport:
    """Inspect effective shapes and return non-fatal efficiency warnings (each also logged once).
    A suggested micro batch divides each of the `world_size` data-parallel ranks' share of the
    target batch.
    """
    settings = _settings(_get(config, "shape_validation"))
    profile = resolve_shape_profile(device, precision, requested_alignment=settings.alignment)
    report = ShapeReport(profile)
    if not settings.enabled or (profile.device_type == "cpu" and not settings.warn_on_cpu):
        return report
    align = profile.alignment
    warnings, seen = report.warnings, set()
    data, model_section = _get(config, "data"), _get(config, "model")
    micro, target = _int_or_none(data, "micro_batch_size"), _int_or_none(data, "target_batch_size")
    if settings.check_batch and micro:
        batch_align = min(align, _MAX_BATCH_ALIGNMENT)
        # Each rank splits its share of the target into micro batches (check_batch_split).
        share = target // world_size if target else None
        suggested = _batch_suggestion(micro, share, batch_align)
        reason = "GEMM rows are micro_batch_size * block_size"
        if suggested is None:
            ranks = f" / {world_size} ranks" if world_size > 1 else ""
            reason += (
                f"; no multiple of {batch_align} divides data.target_batch_size={target}{ranks}, "
                "change both"
            )
        _append_warning(
            warnings,
            seen,
            code="batch",
            name="data.micro_batch_size",
            value=micro,
            alignment=batch_align,
            reason=reason,
            suppress_suggestion=suggested is None,
            suggested=suggested,
        )
    block = _int_or_none(data, "block_size")
    if settings.check_sequence and block:
        _append_warning(
            warnings,
            seen,
            code="sequence",
            name="data.block_size",
            value=block,
            alignment=align,
            reason="attention and GEMM tiles run on the sequence length",
        )
    if settings.check_model:
        dims = _model_dims(model_section) or _module_metadata(model)
        for name, value in dims:
            _append_warning(
                warnings,
                seen,
                code="model",
                name=name,
                value=value,
                alignment=align,
                reason="a model GEMM dimension pads to the tile width",
            )
    vocab = _int_or_none(model_section, "vocab_size")
    if settings.check_vocab and vocab:
        _append_warning(
            warnings,
            seen,
            code="vocab",
            name="model.vocab_size",
            value=vocab,
            alignment=align,
            reason="the output projection is a vocab-wide GEMM",
            # Padded up: fewer rows than the tokenizer's ids would not hold every token.
            suggested=-(-vocab // align) * align,
        )
    log = logger if logger is not None else _logger
    for warning in warnings:
        log.warning(warning.message)
    return report


__all__ = [
    "ShapeProfile",
    "ShapeReport",
    "ShapeWarning",
    "resolve_shape_profile",
    "validate_startup_shapes",
]
