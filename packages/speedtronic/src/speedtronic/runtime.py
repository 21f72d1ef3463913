"""The composition root: one config to a runnable Trainer, in 13 steps (docs/architecture.md)."""

from __future__ import annotations

import dataclasses
import datetime
import random
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

# 2.0 exposed the same builder here and in speedtronic.optimizers.
from speedtronic.optimizers import build_v2_optimizer as build_optimizer
from speedtronic.preflight import (
    NewOutputs,
    check_init_tokenizer,
    check_output_paths,
    refuse_together,
)
from speedtronic.run_lock import claim_run_folders
from speedtronic.trainer import Trainer  # 2.0's Trainer, which also answers to train()
from speedtronic_config import ConfigError, SpeedtronicConfig
from speedtronic_config.errors import on_every_rank
from speedtronic_data import (
    DataError,
    build_dataloader,
    build_eval_dataloader,
    training_tokenizer,
)
from speedtronic_data.rank_shares import check_rank_shares
from speedtronic_model import apply_init_from, build_model
from speedtronic_optim import build_lr_scheduler
from speedtronic_systems import check_training_memory, resolve_device
from speedtronic_systems.parallel import (
    SINGLE,
    ParallelContext,
    agent_store,
    check_batch_split,
    elastic_restarts,
    init_parallel,
    shutdown_parallel,
    wrap_model,
)
from speedtronic_trainer import CheckpointManager, MetricLogger, TrainResult
from speedtronic_trainer.integrations import HookUnavailable


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy, PyTorch CPU and every CUDA device."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds all CUDA devices


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: SpeedtronicConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """Build the LambdaLR warmup/cosine, warmup/constant or warmup-stable-decay schedule."""
    return build_lr_scheduler(optimizer, config.scheduler)


def build_logger(config: SpeedtronicConfig, *, resume: bool = False) -> MetricLogger:
    """Build the text/JSONL MetricLogger, with the hooks named in logging.hooks; `resume`: the
    run continues from a checkpoint in run.output_dir (W&B continues its latest run there).
    """
    return MetricLogger.from_config(config.logging, hook_dir=config.run.output_dir, resume=resume)


def step_target(config: SpeedtronicConfig, max_steps: int | None) -> int:
    """Return the run's step target: an explicit `max_steps` (--max-steps) over
    config.step_target (data.max_steps, else run.max_steps).
    """
    return max_steps if max_steps is not None else config.step_target


def check_node_group_wait(config: SpeedtronicConfig) -> None:
    """Raise ConfigError when a DiLoCo node that is a data-parallel group would time out: its
    other ranks wait in a collective while rank 0 waits for a global model. Every rank reads the
    same config, so rank 0 reports it for the group.
    """
    wait = config.distributed.global_wait_timeout
    if config.distributed.active and wait >= config.parallel.timeout_s:
        raise on_every_rank(
            ConfigError(
                "distributed.global_wait_timeout",
                f"{wait:g}s is not below parallel.timeout_s ({config.parallel.timeout_s:g}s): "
                "the other ranks of the node would time out while rank 0 waits for a global "
                "model",
                allowed="raise parallel.timeout_s well above global_wait_timeout",
            )
        )


def build_coordinator(
    config: SpeedtronicConfig,
    model: torch.nn.Module,
    logger: MetricLogger,
    parallel: ParallelContext = SINGLE,
    tokenizer: Mapping[str, Any] | None = None,
) -> Any:
    """Return the DumbDiLoCo coordinator when distributed.enabled and mode is dumb_diloco, else
    None. Under data parallelism the whole group is one DiLoCo node, led by rank 0. `tokenizer`
    is the identity of the training data's tokenizer (nodes trained on other ids refuse to join).
    """
    if not config.distributed.active:  # disabled, or mode: disabled / single
        return None
    if parallel.active:
        check_node_group_wait(config)
    try:
        from speedtronic_diloco import DumbDiLoCoCoordinator
    except ImportError as error:
        raise ConfigError(
            "distributed.enabled",
            f"true needs the speedtronic-diloco package ({error})",
            allowed="install it with `pip install speedtronic-diloco`",
        ) from error
    return DumbDiLoCoCoordinator(
        config, model, events=logger, parallel=parallel, tokenizer=tokenizer
    )


def _checkpoint_manager(config: SpeedtronicConfig) -> CheckpointManager:
    manager = CheckpointManager.from_config(config.checkpoint, output_dir=config.run.output_dir)
    manager.remove_stale_temp_files()  # what a kill mid-save left; no save is in flight yet
    return manager


def _with_overrides(
    config: SpeedtronicConfig | Mapping[str, Any], device: str | torch.device | None
) -> SpeedtronicConfig:
    """Return the validated config with a `device` argument applied to run.device."""
    if isinstance(config, SpeedtronicConfig):
        config.validate()  # a config object may have been edited since it was built
    else:
        config = SpeedtronicConfig.from_dict(config)
    if device is None:
        return config
    # A new run section (validated on construction); the caller's config is left untouched.
    return dataclasses.replace(config, run=dataclasses.replace(config.run, device=str(device)))


def build_runtime(
    config: SpeedtronicConfig | dict[str, Any],
    *,
    resume: bool = False,
    device: str | torch.device | None = None,
    max_steps: int | None = None,
) -> tuple[Trainer, CheckpointManager]:
    """Build the Trainer and its CheckpointManager from one configuration object.

    An explicit `max_steps` is the step target, over data.max_steps and run.max_steps; it does not
    move the schedule horizon (the CLI's --max-steps does, as a config override). Under torchrun
    with parallel.data_parallel set, this process joins the group and trains its share.
    """
    config = _with_overrides(config, device)  # 1
    seed_everything(config.run.seed)  # 2: every rank builds the same model
    resolved = resolve_device(config.run.device)  # 3
    parallel = init_parallel(config.parallel, resolved)  # on CUDA, each rank gets cuda:LOCAL_RANK
    resolved = parallel.device if parallel.mode != "none" else resolved
    check_batch_split(
        config.data.target_batch_size, config.data.micro_batch_size, parallel.world_size
    )
    # Before anything is allocated (run.memory_check); when any rank's device is too small,
    # every rank refuses.
    check_training_memory(config, resolved, parallel)
    check_init_tokenizer(config, parallel.all_gather_object)  # every rank refuses, or none
    # A run refused from here on (a folder, the data, a checkpoint) leaves no new folder behind.
    refusal = None
    try:
        outputs = NewOutputs(config)
    except (OSError, RuntimeError) as error:  # a folder it cannot resolve (a symlink loop)
        refusal = error
    # As a barrier too: every rank sees the folders as new, whichever rank makes them first.
    refuse_together(refusal, parallel.all_gather_object)
    with outputs.removed_on_error():
        # A bad folder fails now, not at the first checkpoint; on any rank, every rank refuses.
        check_output_paths(config, parallel.all_gather_object)
        lock = claim_run_folders(config, parallel)  # before anything of another run is touched
        try:
            trainer, manager = _assemble(config, parallel, resolved, resume, max_steps)
        except BaseException:
            lock.release()
            raise
    for warning in lock.warnings:  # a folder its filesystem could not lock
        trainer.logger.warning(warning)
    # The logger first: its files and hooks (TensorBoard, W&B) write in the locked folder.
    closes = weakref.finalize(trainer, trainer.logger.close)
    # Not at exit, where wandb's own exit hook has already stopped its service (its run.finish()
    # would then fail, "Connection lost"), and finishes the run itself.
    closes.atexit = False
    ties = [closes, lock.tie_to(trainer)]
    if parallel.is_main:  # one rank removes; every rank's saves are over when its trainer goes
        ties.append(outputs.tie_to(trainer))
    _TIES[trainer] = ties
    return trainer, manager


# What build_runtime tied to each trainer's life: the close of its logger (which finishes a W&B
# run: left active, the next wandb.init in the process returned it, and a second run logged into
# the first), its folders' lock, the removal of a checkpoint folder left empty. A trainer can
# outlive its run by much: a library that keeps an exception raised in an import made during the
# run (pyparsing's cache, under matplotlib) keeps every frame that import was made from, and a
# caller's frame holds the trainer.
_TIES: weakref.WeakKeyDictionary[Trainer, list[weakref.finalize]] = weakref.WeakKeyDictionary()


def end_run(trainer: Trainer) -> None:
    """Release now what build_runtime tied to `trainer`'s life (see _TIES), as its end would:
    another process, or this one, may then run on its folders at once. Call it once the run is
    over (the trainer is not to fit again); idempotent.
    """
    for tie in _TIES.pop(trainer, ()):
        tie()


def _assemble(
    config: SpeedtronicConfig,
    parallel: Any,
    resolved: torch.device,
    resume: bool,
    max_steps: int | None,
) -> tuple[Trainer, CheckpointManager]:
    """Steps 4-13 of build_runtime: model, data, optimizer, schedule, checkpoints, logger,
    coordinator and the trainer, resumed when asked.
    """
    try:
        model = build_model(config.model)  # 4
    except ConfigError as error:  # from the model section, which every rank reads alike
        on_every_rank(error)
        raise
    if config.model.init_from is not None:
        refusal = None
        try:
            model = apply_init_from(model, config.model.init_from)
        except ConfigError as error:  # each node reads its own copy of the folder
            refusal = error
        refuse_together(refusal, parallel.all_gather_object)  # before DDP/FSDP2 wrap together
    # 4b: wrap before the optimizer exists (fully_shard replaces the parameters).
    model = wrap_model(model.to(resolved), parallel, config.parallel)
    if parallel.active:  # then each rank draws its own dropout (and other) randomness
        seed_everything(config.run.seed + parallel.rank)
    shares = {"device": resolved, "rank": parallel.rank, "world_size": parallel.world_size}
    refusal = None
    try:  # 5: each node reads its own copy of the data (a node may lack it)
        dataloader = build_dataloader(config.data, **shares)
        # Validation text is tokenized like the training data; other validation shards are
        # refused.
        eval_dataloader = build_eval_dataloader(config.data, **shares)
    except DataError as error:
        refusal = error
    refuse_together(refusal, parallel.all_gather_object)
    check_rank_shares(dataloader, eval_dataloader, parallel.all_gather_object)
    tokenizer = training_tokenizer(config.data)  # recorded in every checkpoint
    # 6: under DDP or FSDP2, Muon splits its Newton–Schulz over the ranks.
    optimizer = build_optimizer(model, config, resolved, distributed=parallel.mode != "none")
    scheduler = build_scheduler(optimizer, config)  # 7
    manager = _checkpoint_manager(config)  # 8
    earlier = manager.latest_path() if manager.enabled else None
    resumes = resume or config.checkpoint.resume or _restart_resumes(earlier, parallel, config)
    logger = _group_logger(config, parallel, resumes and earlier is not None)  # 9
    if config.model.init_from is not None:
        logger.info("model.init_from: weights loaded from %s", config.model.init_from)
    identity = tokenizer.identity() if tokenizer is not None else None
    coordinator = build_coordinator(config, model, logger, parallel, identity)  # 10
    target = step_target(config, max_steps)  # 11
    # 12: the trainer resolves the precision plan and the startup shape report, once.
    trainer = Trainer(
        model,
        optimizer,
        dataloader,
        device=resolved,
        config=config,
        scheduler=scheduler,
        logger=logger,
        checkpoint_manager=manager,
        coordinator=coordinator,
        max_steps=target,
        eval_dataloader=eval_dataloader,
        parallel=parallel,
        tokenizer=identity,
    )
    if resumes:  # 13
        trainer.resume_latest()  # warns and starts fresh when there is none
    elif earlier is not None:
        _remember_fresh_start(earlier, parallel, config)
        logger.warning(
            "%s holds an earlier run's checkpoints (latest %s); this run starts at step 0 and "
            "replaces them as it saves: pass --resume to continue that run, or set another "
            "run.output_dir",
            manager.directory,
            earlier.name,
        )
    if coordinator is not None:  # its refusal of a used node id names the fix that applies
        coordinator.note_checkpoint(manager.directory, None if resumes else earlier)
    _warn_if_warmup_outlasts(config, target, trainer.step, logger)
    return trainer, manager


def _group_logger(
    config: SpeedtronicConfig, parallel: ParallelContext, resume: bool
) -> MetricLogger:
    """Return this rank's logger: rank 0's from logging.* (with its hooks, `resume` as for
    build_logger), a quiet one on every other rank. A hook rank 0 cannot start (HookUnavailable:
    its package missing on that node, wandb not logged in there) is raised on every rank: the
    others would wait for it in their next collective.
    """
    if not parallel.is_main:
        logger, unavailable = MetricLogger(level="ERROR"), None
    else:
        try:
            logger, unavailable = build_logger(config, resume=resume), None
        except HookUnavailable as error:
            logger, unavailable = None, error
    unavailable = parallel.broadcast_object(unavailable)  # rank 0's own error on rank 0
    if unavailable is not None:
        raise on_every_rank(unavailable)
    return logger


def _warn_if_warmup_outlasts(
    config: SpeedtronicConfig, target: int, start: int, logger: MetricLogger
) -> None:
    """Warn when the steps this run trains (after any resume) all fall inside the warmup; a
    target at or below the resumed step trains none, and is left unwarned.
    """
    warmup = config.scheduler.warmup_steps
    if warmup > target > start:  # common with a short --max-steps: a run at a fraction of its lr
        logger.warning(
            "scheduler.warmup_steps is %d but the run ends at step %d: the learning rate never "
            "reaches optimizer.lr; lower it (e.g. --set scheduler.warmup_steps=%d)",
            warmup,
            target,
            max(1, target // 10),
        )


# The key, in the part of torchrun's agent store every restart round shares, naming the earlier
# run's checkpoint a launch started fresh beside (_checkpoint_identity).
_FRESH_BESIDE = "fresh_beside"


def elastic_restart() -> bool:
    """Return True when torchrun restarted this worker after a failure (--max-restarts)."""
    return elastic_restarts()[0] > 0


def _checkpoint_identity(path: Path) -> str:
    """Return what tells a checkpoint from a later one of the same name: name and mtime."""
    return f"{path.name} {path.stat().st_mtime_ns}"


def _launch_store(config: SpeedtronicConfig) -> Any:
    """Return the part of torchrun's agent store every restart round shares (None without one)."""
    timeout = datetime.timedelta(seconds=config.parallel.timeout_s)
    return agent_store(timeout, every_round=True)


def _remember_fresh_start(earlier: Path, parallel: Any, config: SpeedtronicConfig) -> None:
    """Record, for a restart of this launch (--max-restarts), that its first round started fresh
    beside an earlier run's checkpoint `earlier`: that one is not this run's to resume.
    """
    made, allowed = elastic_restarts()
    if made or not allowed or not parallel.is_main:
        return
    store = _launch_store(config)
    if store is not None:
        store.set(_FRESH_BESIDE, _checkpoint_identity(earlier))


def _restart_resumes(earlier: Path | None, parallel: Any, config: SpeedtronicConfig) -> bool:
    """Return True when torchrun restarted this worker after a failure (--max-restarts): it
    resumes from the last checkpoint instead of starting over, unless that checkpoint is still
    the earlier run's that the launch started fresh beside (decided by rank 0 for every rank).
    """
    if not elastic_restart():
        return False
    beside = False
    if parallel.is_main and earlier is not None:
        store = _launch_store(config)
        if store is not None and store.check([_FRESH_BESIDE]):
            beside = store.get(_FRESH_BESIDE).decode() == _checkpoint_identity(earlier)
    return not parallel.broadcast_object(beside)


def train_from_config(
    config: SpeedtronicConfig | dict[str, Any],
    *,
    resume: bool = False,
    device: str | torch.device | None = None,
    max_steps: int | None = None,
) -> TrainResult:
    """Build the runtime and train to the target; return the TrainResult."""
    trainer, _ = build_runtime(config, resume=resume, device=device, max_steps=max_steps)
    parallel = trainer.parallel
    try:
        return trainer.fit()
    finally:
        trainer.close()
        end_run(trainer)
        del trainer  # the model's DDP reducer lets go of the group before it is destroyed
        shutdown_parallel(parallel)


run = train_from_config
train = train_from_config

__all__ = [
    "build_coordinator",
    "build_logger",
    "build_optimizer",
    "build_runtime",
    "build_scheduler",
    "check_node_group_wait",
    "end_run",
    "run",
    "seed_everything",
    "step_target",
    "train",
    "train_from_config",
]
