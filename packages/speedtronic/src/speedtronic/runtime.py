"""The composition root: turn one config into a runnable Trainer, in spec/02's 13 steps."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from speedtronic_config import ConfigError, SpeedtronicConfig
from speedtronic_data import build_dataloader, build_eval_dataloader
from speedtronic_model import apply_init_from, build_model
from speedtronic_optim import build_lr_scheduler
from speedtronic_optim import build_optimizer as _build_optimizer
from speedtronic_systems import resolve_device, resolve_precision, validate_startup_shapes
from speedtronic_trainer import CheckpointManager, MetricLogger, Trainer, TrainResult


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy, PyTorch CPU and every CUDA device."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds all CUDA devices


def build_optimizer(model: torch.nn.Module, config: Any, device: Any) -> torch.optim.Optimizer:
    """Build the configured AdamW, hybrid Muon, or cautious optimizer (config or its optimizer
    section).
    """
    return _build_optimizer(model, getattr(config, "optimizer", config), device)


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: SpeedtronicConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """Build the LambdaLR warmup/cosine, warmup/constant or warmup-stable-decay schedule."""
    return build_lr_scheduler(optimizer, config.scheduler)


def build_logger(config: SpeedtronicConfig) -> MetricLogger:
    """Build the text/JSONL MetricLogger, with the hooks named in logging.hooks."""
    return MetricLogger.from_config(config.logging, hook_dir=config.run.output_dir)


def build_coordinator(
    config: SpeedtronicConfig, model: torch.nn.Module, logger: MetricLogger
) -> Any:
    """Return the DumbDiLoCo coordinator for an enabled distributed section, else None."""
    if not config.distributed.enabled:
        return None
    try:
        from speedtronic_diloco import DumbDiLoCoCoordinator
    except ImportError as error:
        raise ConfigError(
            "distributed.enabled",
            f"true needs the speedtronic-diloco package ({error})",
            allowed="install it with `pip install speedtronic-diloco`",
        ) from error
    return DumbDiLoCoCoordinator(config, model, events=logger)


def _checkpoint_manager(config: SpeedtronicConfig) -> CheckpointManager:
    return CheckpointManager.from_config(config.checkpoint, output_dir=config.run.output_dir)


def build_runtime(
    config: SpeedtronicConfig | dict[str, Any],
    *,
    resume: bool = False,
    device: str | torch.device | None = None,
    max_steps: int | None = None,
) -> tuple[Trainer, CheckpointManager]:
    """Build the Trainer and its CheckpointManager from one configuration object."""
    values = dict(config) if isinstance(config, dict) else config.to_dict()
    if max_steps is not None:  # as an override, so the default schedule horizon follows it
        values["run"] = {**values.get("run", {}), "max_steps": max_steps}
    if device is not None:
        values["run"] = {**values.get("run", {}), "device": str(device)}
    config = SpeedtronicConfig.from_dict(values)  # 1
    seed_everything(config.run.seed)  # 2
    resolved = resolve_device(config.run.device)  # 3
    model = apply_init_from(build_model(config.model), config.model.init_from)  # 4
    pin = resolved.type == "cuda"
    dataloader = build_dataloader(config.data, pin_memory_device=pin)  # 5
    eval_dataloader = build_eval_dataloader(config.data, pin_memory_device=pin)
    optimizer = build_optimizer(model.to(resolved), config, resolved)  # 6
    scheduler = build_scheduler(optimizer, config)  # 7
    manager = _checkpoint_manager(config)  # 8
    logger = build_logger(config)  # 9
    coordinator = build_coordinator(config, model, logger)  # 10
    target = config.step_target  # 11
    precision = resolve_precision(config.precision, resolved)
    shape_report = validate_startup_shapes(config, model, resolved, precision, logger=logger)
    trainer = Trainer(
        model,
        optimizer,
        dataloader,
        device=resolved,
        config=config,
        scheduler=scheduler,  # 12
        precision=precision,
        logger=logger,
        checkpoint_manager=manager,
        coordinator=coordinator,
        max_steps=target,
        shape_report=shape_report,
        eval_dataloader=eval_dataloader,
    )
    if resume or config.checkpoint.resume:  # 13 (warns and starts fresh when there is none)
        trainer.resume_latest()
    return trainer, manager


def train_from_config(
    config: SpeedtronicConfig | dict[str, Any],
    *,
    resume: bool = False,
    device: str | torch.device | None = None,
    max_steps: int | None = None,
) -> TrainResult:
    """Build the runtime and train to the target; return the TrainResult."""
    trainer, _ = build_runtime(config, resume=resume, device=device, max_steps=max_steps)
    try:
        return trainer.fit()
    finally:
        trainer.close()


run = train_from_config
train = train_from_config

__all__ = [
    "build_coordinator",
    "build_logger",
    "build_optimizer",
    "build_runtime",
    "build_scheduler",
    "run",
    "seed_everything",
    "train",
    "train_from_config",
]
