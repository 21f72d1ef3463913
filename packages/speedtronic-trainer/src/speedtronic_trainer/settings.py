"""The loop settings the trainer reads from a (duck-typed) SpeedtronicConfig, with defaults for
config=None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NONFINITE_POLICIES = ("skip", "stop")


def _get(config: Any, dotted: str, default: Any) -> Any:
    """Return config.<dotted> or `default` when any part is missing or None."""
    value = config
    for part in dotted.split("."):
        value = getattr(value, part, None)
        if value is None:
            return default
    return value


def _enabled(value: Any) -> bool:
    """Read a root flag given as a bool or as a section with `enabled` (compile: {enabled:
    true}).
    """
    return bool(getattr(value, "enabled", value))


@dataclass
class TrainerSettings:
    """Every config value the loop consults, resolved once at construction."""

    accumulation_steps: int = 1
    grad_clip: float | None = None
    max_steps: int | None = None
    compile: bool = False
    gradient_checkpointing: bool = False
    ooo_backprop: bool = False
    ooo_streams: int = 4
    reset_inner_optimizer: bool = True
    nonfinite_loss: str = "stop"
    save_final: bool = True
    save_on_signal: bool = True
    eval_every: int | None = None
    eval_steps: int | None = None
    progress: Any = "auto"
    shape_validation: bool = False

    def __post_init__(self) -> None:
        if self.accumulation_steps <= 0:
            raise ValueError(
                f"accumulation_steps must be positive, got {self.accumulation_steps!r}"
            )
        if self.nonfinite_loss not in NONFINITE_POLICIES:
            raise ValueError(
                f"run.nonfinite_loss must be one of {NONFINITE_POLICIES}, got "
                f"{self.nonfinite_loss!r}"
            )
        if self.eval_every is not None and self.eval_every <= 0:
            raise ValueError(f"data.eval_every must be positive, got {self.eval_every!r}")
        if self.eval_steps is not None and self.eval_steps <= 0:
            raise ValueError(f"data.eval_steps must be positive, got {self.eval_steps!r}")

    @classmethod
    def from_config(cls, config: Any | None) -> TrainerSettings:
        """Resolve settings from a SpeedtronicConfig-like object; None gives the defaults."""
        if config is None:
            return cls()
        data = getattr(config, "data", None)
        accumulation = getattr(data, "accumulation_steps", None)
        if accumulation is None and data is not None:
            accumulation = max(
                1, _get(data, "target_batch_size", 1) // _get(data, "micro_batch_size", 1)
            )
        return cls(
            accumulation_steps=int(accumulation or 1),
            grad_clip=_get(config, "optimizer.grad_clip", None),
            max_steps=_get(config, "run.max_steps", None),
            compile=_enabled(getattr(config, "compile", False)),
            gradient_checkpointing=_enabled(getattr(config, "gradient_checkpointing", False)),
            ooo_backprop=_enabled(getattr(config, "ooo_backprop", False)),
            ooo_streams=int(_get(config, "ooo_streams", 4)),
            reset_inner_optimizer=bool(_get(config, "distributed.reset_inner_optimizer", True)),
            nonfinite_loss=str(_get(config, "run.nonfinite_loss", "stop")),
            save_final=bool(_get(config, "checkpoint.save_final", True)),
            save_on_signal=bool(_get(config, "checkpoint.save_on_signal", True)),
            eval_every=_get(config, "data.eval_every", None),
            eval_steps=_get(config, "data.eval_steps", None),
            progress=_get(config, "logging.progress", "auto"),
            shape_validation=bool(_get(config, "shape_validation.enabled", False)),
        )


__all__ = ["NONFINITE_POLICIES", "TrainerSettings"]
