"""Architecture-neutral training loop."""

from __future__ import annotations

import contextlib
import itertools
import math
import shutil
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import torch

from speedtronic_config import ConfigError, SpeedtronicConfig
from speedtronic_config.errors import describe_ranks, on_every_rank
from speedtronic_config.sections import trains_on_synthetic
from speedtronic_config.serialize import plain_data
from speedtronic_systems.checkpointing import gradient_checkpointing_switch
from speedtronic_systems.compile_choice import resolve_compile
from speedtronic_systems.cpu_allocator import apply_cpu_allocator
from speedtronic_systems.modes import switch_to_eval
from speedtronic_systems.parallel import (
    SINGLE,
    ParallelContext,
    check_batch_split,
    check_optimizer_after_wrapping,
    gradient_sync,
    model_class_name,
    syncs_every_microbatch,
    torchrun_worker,
    total_norm,
    unwrap_model,
)
from speedtronic_systems.precision import (
    PrecisionPlan,
    agree_precision,
    autocast_context,
    make_grad_scaler,
    resolve_precision,
)
from speedtronic_systems.shapes import validate_startup_shapes
from speedtronic_trainer.batches import (
    batch_size_and_tokens,
    call_model,
    loss_from_output,
    move_batch,
    shifts_labels_itself,
    unshifted_labels,
    valid_label_count,
)
from speedtronic_trainer.checkpoint import (
    CheckpointManager,
    capture_rng_state,
    checkpoint_digest,
    restore_rng_state,
)
from speedtronic_trainer.checkpoint_checks import (
    CheckpointError,
    check_model_fits,
    check_settings,
    check_tokenizer,
    group_settings,
    restore_optimizer,
)
from speedtronic_trainer.data_position import BatchStream
from speedtronic_trainer.emergency import StepGuard
from speedtronic_trainer.metric_logger import MetricLogger
from speedtronic_trainer.metrics import StepMetrics, adamw_branch_lr
from speedtronic_trainer.preemption import StopSignal
from speedtronic_trainer.progress import ProgressBar, is_terminal, progress_enabled
from speedtronic_trainer.sharded import (
    load_full_model_state,
    load_sharded,
    save_sharded,
    shard_optimizer_state,
    sharded_model_weights,
)

CHECKPOINT_FORMAT = 1
# A "skip" policy that keeps meeting non-finite losses is a diverged run, not a bad batch.
MAX_CONSECUTIVE_SKIPS = 50
# The data settings a checkpoint's data position depends on: which samples, in which order and
# batches (data.seed, shuffle and drop_last order them; the sizes cut them). target_batch_size is
# not one: it sets how many micro batches a step takes, not which.
DATA_ORDER_FIELDS = (
    "shard_path",
    "text_path",
    "dataset",
    "synthetic",
    "num_tokens",
    "block_size",
    "micro_batch_size",
    "shuffle",
    "drop_last",
    "seed",
)


# The key prefix of a torch.compile'd module's state dict (its OptimizedModule's _orig_mod).
_COMPILED_PREFIX = "_orig_mod."


class NonFiniteLossError(RuntimeError):
    """The loss or gradient norm was NaN/inf and the policy is `stop` (or too many steps were
    skipped).
    """


class SyncCoordinator(Protocol):
    """What the trainer calls around each optimizer step. A coordinator that may block at a
    boundary (DiLoCo's wait for a global model) can also define `interrupt()`: the signal handler
    calls it on SIGTERM/SIGINT, so the step ends and the run checkpoints and stops.
    """

    def start(self) -> None: ...
    def after_optimizer_step(self, model: Any, step: int) -> bool | None: ...
    def stop(self) -> None: ...
    def state_dict(self) -> dict[str, Any] | None: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class TrainResult:
    """What one fit() call did; steps/samples/tokens are the trainer's absolute counters at the
    end.
    """

    steps: int
    samples: int
    tokens: int
    final_loss: float | None
    elapsed_s: float
    metrics: dict[str, Any] = field(default_factory=dict)
    steps_run: int = 0
    skipped_steps: int = 0
    stopped_by: str | None = None  # the signal name when SIGTERM/SIGINT ended the run early
    checkpoint: Path | None = None  # the last checkpoint this fit wrote


def _signal_counts(received: str | None) -> list[bool]:
    """This rank's share of the ranks' signal counts (SIGTERM, SIGINT) for one all-reduce."""
    return [received == "SIGTERM", received == "SIGINT"]


def _agreed_signal(terms: float, interrupts: float) -> str | None:
    """Return the signal every rank stops for, from the ranks' counts of each (SIGTERM over
    SIGINT): every rank names the same one, so every rank exits alike.
    """
    return "SIGTERM" if terms > 0 else "SIGINT" if interrupts > 0 else None


@dataclass
class StepOutcome:
    """One optimizer step: its loss and gradient norm, what it consumed, whether it was applied."""

    loss: float
    grad_norm: float | None
    samples: int  # over every data-parallel rank
    tokens: int
    applied: bool
    seconds: float = 0.0
    stop: str | None = None  # a rank received this signal: every rank stops after this step
    labels: int | None = None  # valid label positions over every rank; None: no labels


@dataclass
class _FitProgress:
    """What fit() tracks across steps: the latest losses, the checkpoint, a stop signal."""

    final_loss: float | None = None
    val_loss: float | None = None
    val_step: int | None = None  # the step whose weights val_loss scored
    checkpoint: Path | None = None
    checkpoint_step: int | None = None  # the step `checkpoint` holds
    stopped_by: str | None = None
    consecutive_skips: int = 0

    def evaluated(self, val_loss: float | None, step: int) -> None:
        """Keep the loss of a completed evaluation at `step` (None: cut short, or no batch)."""
        if val_loss is not None:
            self.val_loss, self.val_step = val_loss, step


def _same_setting(first: Any, second: Any) -> bool:
    """Return whether two group values are equal; betas may come back as a list."""
    if isinstance(first, (tuple, list)) and isinstance(second, (tuple, list)):
        return len(first) == len(second) and all(map(_same_setting, first, second))
    if isinstance(first, torch.Tensor) or isinstance(second, torch.Tensor):
        return torch.equal(torch.as_tensor(first), torch.as_tensor(second))
    return bool(first == second)


def _apply_schedule(scheduler: Any) -> None:
    """Set each parameter group's rate to what `scheduler` (just restored) gives at its step.

    The optimizer state holds the rate the checkpoint's schedule set for the next step: under
    another horizon, warmup or schedule, the first resumed update would still run at it. A
    LambdaLR's rate is a closed form of its step, so it is recomputed (the same value when the
    schedule is unchanged); another scheduler is left as torch restored it.
    """
    if not isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
        return
    step, lambdas = scheduler.last_epoch, scheduler.lr_lambdas
    rates = [base * fn(step) for base, fn in zip(scheduler.base_lrs, lambdas, strict=True)]
    for group, rate in zip(scheduler.optimizer.param_groups, rates, strict=True):
        group["lr"] = rate
    scheduler._last_lr = rates  # get_last_lr() reports the rate the next update runs at


def _as_config(config: Any) -> SpeedtronicConfig:
    """Return config as a SpeedtronicConfig: None gives every default, a mapping is validated."""
    if config is None:
        return SpeedtronicConfig()
    if isinstance(config, SpeedtronicConfig):
        return config
    if isinstance(config, Mapping):
        return SpeedtronicConfig.from_dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return SpeedtronicConfig.from_dict(to_dict())
    raise TypeError(
        f"Trainer(config=...) takes a SpeedtronicConfig, a mapping or None, got "
        f"{type(config).__name__}"
    )


class Trainer:
    """Train a user-provided module with optional local or distributed sync.

    The model receives a batch dictionary as keywords, or the first two items of a tuple/list batch
    as (inputs, labels). It may return a scalar loss, a mapping with loss or logits, or a tuple
    whose first item is a loss or 3-D logits. Every setting comes from `config` (a
    SpeedtronicConfig; None means every default).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        dataloader: Iterable[Any],
        *,
        device: torch.device | str,
        config: Any | None = None,
        scheduler: Any | None = None,
        precision: PrecisionPlan | None = None,
        logger: MetricLogger | None = None,
        checkpoint_manager: CheckpointManager | None = None,
        coordinator: SyncCoordinator | None = None,
        max_steps: int | None = None,
        start_step: int = 0,
        shape_report: Any | None = None,
        eval_dataloader: Iterable[Any] | None = None,
        parallel: ParallelContext | None = None,
        tokenizer: Mapping[str, Any] | None = None,
    ) -> None:
        self._config_given = config is not None
        self.config = _as_config(config)
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.optimizer = optimizer
        # A data-parallel group (built by the runtime from parallel.*); SINGLE for one process.
        self.parallel = parallel if parallel is not None else SINGLE
        if self.parallel.mode != "none":
            check_optimizer_after_wrapping(self.model, optimizer)
        data = self.config.data
        check_batch_split(data.target_batch_size, data.micro_batch_size, self.parallel.world_size)
        self._accumulation = self.config.accumulation_steps // self.parallel.world_size
        self._sync_every_microbatch = syncs_every_microbatch(self.parallel, self.config.parallel)
        self.dataloader = dataloader
        self.eval_dataloader = eval_dataloader
        self.scheduler = scheduler
        self.logger = logger if logger is not None else MetricLogger()
        if isinstance(eval_dataloader, Iterator):  # not iter(): a DataLoader's starts workers
            self.logger.warning(
                "the eval_dataloader is a one-shot iterator: each evaluation reads its next "
                "batches (data.eval_steps of them), so no two val_loss values come from the same "
                "data, until it runs dry; pass a re-iterable loader (a DataLoader or a list)"
            )
        self.checkpoint_manager = checkpoint_manager
        self.coordinator = coordinator
        # Which tokenizer wrote the training data (kind, vocab_size, name, sha256): recorded in
        # every checkpoint, so resume, export and sample can refuse tokens of another one.
        self.tokenizer = dict(tokenizer) if tokenizer is not None else None
        # Without a config there is no implicit target: fit() must be told how far to go.
        default_target = self.config.step_target if self._config_given else None
        self.max_steps = max_steps if max_steps is not None else default_target
        self.step = start_step
        self.samples = 0
        self.tokens = 0
        self.skipped_steps = 0
        if precision is None:
            precision = resolve_precision(
                self.config.precision, self.device, model=unwrap_model(self.model)
            )
            if precision.reason:
                self.logger.info("precision: auto -> %s (%s)", precision.mode, precision.reason)
        agreed = agree_precision(precision, self.parallel)
        if agreed is not precision:
            self.logger.warning("precision: %s", agreed.reason)
        self.precision = agreed
        self.scaler = make_grad_scaler(self.precision)
        self.shape_report = shape_report if shape_report is not None else self._check_shapes()
        self._stream = BatchStream(dataloader)
        self._guard = StepGuard()
        self.emergency_checkpoint: Path | None = None  # written when fit() failed mid-run
        self._last_checkpoint: Path | None = None  # see last_checkpoint, without a manager
        # A transformers causal LM would shift the already-shifted labels again (and learn the
        # token after next): it gets no labels, and the loss comes from its logits.
        self._labels_to_model = not shifts_labels_itself(unwrap_model(self.model))
        if not self._labels_to_model:
            self.logger.info(
                "%s shifts labels itself; the batches' labels are shifted already, so it is "
                "called without them and the trainer takes the loss from its logits",
                type(unwrap_model(self.model)).__name__,
            )
        self._labels_checked = self._labels_to_model  # see _check_labels_shifted
        self._compiled: Any | None = None
        self._compile_decided = False
        self._compiled_ok = False
        # optimizer.lr/adamw_lr a resume kept from its checkpoint (the schedule's base rates):
        # later checkpoints record them, so their config says what the run trained at.
        self._kept_rates: dict[str, float] = {}
        self._config_logged = False  # the hooks were given the config (at the first fit)
        # A signal cut this step's interval evaluation short: the next fit() runs it first, as
        # the run that never stopped did (a resume reads it from the checkpoint).
        self._evaluation_due = False
        self._stage_scheduler: Any | None = None
        self._metrics = StepMetrics(
            unwrap_model(self.model), self.device, self.precision, self.parallel.world_size
        )
        self._non_blocking = self.device.type == "cuda"
        self._configure_features()

    @property
    def last_checkpoint(self) -> Path | None:
        """This trainer's own latest checkpoint (written, or resumed from): the one to resume,
        where the folder's newest may be an earlier run's that this one started fresh beside.
        Kept by the checkpoint manager (its run_checkpoint), so that a failed write names it.
        """
        manager = self.checkpoint_manager
        return manager.run_checkpoint if manager is not None else self._last_checkpoint

    @last_checkpoint.setter
    def last_checkpoint(self, path: Path | None) -> None:
        # Set on every rank, where only rank 0's manager commits (FSDP2's failed shard write
        # names it on every rank alike).
        if self.checkpoint_manager is not None:
            self.checkpoint_manager.run_checkpoint = path
        else:
            self._last_checkpoint = path

    def _check_shapes(self) -> Any:
        """Run the startup shape check the runtime did not already run."""
        # Without a config the check reads the module's own widths, not default sections.
        return validate_startup_shapes(
            self.config if self._config_given else None,
            self.model,
            self.device,
            self.precision,
            logger=self.logger,
            world_size=self.parallel.world_size,
        )

    def accumulation_steps(self) -> int:
        """Return how many microbatches this process runs per optimizer update."""
        return self._accumulation

    # ----------------------------------------------------------------------------------- features

    def _configure_features(self) -> None:
        apply_cpu_allocator(self.config.run.cpu_allocator, self.device, self.logger)
        if self.config.gradient_checkpointing:
            self._enable_gradient_checkpointing()
        if self.config.ooo_backprop:
            from speedtronic_systems.scheduling import StageStreamScheduler

            self._stage_scheduler = StageStreamScheduler(
                self.model, self.device, num_streams=self.config.ooo_streams, logger=self.logger
            )

    def _enable_gradient_checkpointing(self) -> None:
        model = unwrap_model(self.model)
        # A transformers model has its own switch (what speedtronic.set_gradient_checkpointing
        # also calls); 2.0 looked for ours alone and trained such a model without checkpointing.
        switch = gradient_checkpointing_switch(model, True)
        if switch is None:
            self.logger.warning(
                "gradient_checkpointing is on but %s has no set_gradient_checkpointing(enabled) "
                "hook; training without it",
                type(model).__name__,
            )
            return
        name, hook = switch
        try:
            hook()
        except Exception as exc:  # a capability, not a requirement: degrade and say so
            self.logger.warning(
                "%s failed (%s: %s); training without it", name, type(exc).__name__, exc
            )

    def _decide_compile(self, remaining_steps: int) -> None:
        """Compile (or not) once, on the first fit(): `auto` weighs the steps left after any
        resume, which the constructor does not know yet. Every rank decides alike.
        """
        self._compile_decided = True
        compile_model, why = resolve_compile(self.config.compile, self.device, remaining_steps)
        if self.config.compile == "auto":
            self.logger.info("compile: auto -> %s (%s)", "on" if compile_model else "off", why)
        if compile_model:
            why = self._enable_compile() or why
        self._agree_on_compile(why)

    def _enable_compile(self) -> str | None:
        """torch.compile the model; return why it could not be, else None."""
        try:
            mode = self.config.compile_mode  # the default mode keeps 2.0's plain call
            options = {} if mode == "default" else {"mode": mode}
            self._compiled = torch.compile(self.model, **options)
        except Exception as exc:
            self.logger.warning(
                "torch.compile failed (%s: %s); training eagerly", type(exc).__name__, exc
            )
            self._compiled = None
            return f"torch.compile failed ({type(exc).__name__}: {exc})"
        return None

    def _agree_on_compile(self, why: str) -> None:
        """Train eagerly on every rank unless every rank compiled (`why`: this rank's reason when
        it did not). `auto` probes each rank's own machine (its C++ compiler), and torch.compile
        can fail on one rank alone; but a step waits for its slowest rank, so compiling some
        ranks pays nothing, and a compiled rank cannot fall back alone if its model fails on
        first use (_compile_failed_alone). One collective, on the first fit().
        """
        compiled = self._compiled is not None
        ranks = self.parallel.all_gather_object((compiled, why))
        if len({done for done, _ in ranks}) == 1:
            return
        self._compiled = None
        kinds = describe_ranks(["compiled" if done else "eager" for done, _ in ranks])
        rank, reason = next((r, reason) for r, (done, reason) in enumerate(ranks) if not done)
        self.logger.warning(
            "compile: the ranks decided differently (%s); every rank trains eagerly. Rank %d: %s",
            kinds,
            rank,
            reason,
        )

    # --------------------------------------------------------------------------------- forward

    def _forward(self, batch: Any) -> torch.Tensor:
        """Return the microbatch loss, falling back to eager once if the compiled model fails on
        first use (in a run of one process: see _compile_failed_alone).
        """
        if self._compiled is not None:
            try:
                with autocast_context(self.precision, self.device):
                    output = call_model(self._compiled, batch, labels=self._labels_to_model)
                    loss = loss_from_output(output, batch)
                self._compiled_ok = True
                return loss
            except Exception as exc:
                if self._compiled_ok:
                    raise  # the compiled path worked before: this is a model or data error
                if self.parallel.active:
                    raise self._compile_failed_alone(exc) from exc
                self.logger.warning(
                    "compiled model failed on first run (%s: %s); training eagerly",
                    type(exc).__name__,
                    exc,
                )
                self._compiled = None
        with autocast_context(self.precision, self.device):
            output = call_model(self.model, batch, labels=self._labels_to_model)
            return loss_from_output(output, batch)

    def _compile_failed_alone(self, exc: Exception) -> RuntimeError:
        """Return the error that stops a data-parallel rank whose compiled model failed on first
        use. It cannot retry eagerly alone: the failure may come after some of the step's
        collectives ran (DDP's buffer broadcast, FSDP2's all-gathers run outside the compiled
        graph), and its peers, compiled or not, would pair their next collectives with its repeats
        and wait until parallel.timeout_s. Nor can the ranks agree first: a peer that did not fail
        is already in those collectives.
        """
        return RuntimeError(
            f"the compiled model failed on its first step on rank {self.parallel.rank} "
            f"({type(exc).__name__}: {exc}); under data parallelism a rank cannot fall back to "
            "eager alone (its peers are in the step's collectives); set compile: false"
        )

    # ------------------------------------------------------------------------------------ step

    def _step_batches(self) -> tuple[list[Any], list[float], int | None]:
        """Take this rank's microbatches of the step; return them, each one's share of the update
        over every rank (its share of the step's valid labels when every rank's batches have
        labels, else one share of the k microbatches on each of the ranks), and the step's valid
        labels over every rank (None without labels). One collective, before any forward, agrees
        on the weights and on whether every rank got its batches: a rank whose loader failed (ran
        out, gave none, could not read) raises on every rank. Alone, it left its peers in the
        step's collectives, and its own next collective met theirs (a silent wrong sum).
        """
        microbatches, failure = self._take(
            lambda: [next(self._stream) for _ in range(self._accumulation)]
        )
        counts = [valid_label_count(b) for b in microbatches or []]
        unlabelled = any(c is None for c in counts)
        # Token-weighted over the whole global batch: the label count summed over all ranks.
        total, unlabelled_ranks, failed = self.parallel.all_reduce_sum(
            [float(sum(c or 0 for c in counts)), unlabelled, failure is not None]
        )
        if failed:
            raise self._data_failed(failure, f"training data loader, for step {self.step + 1}")
        if unlabelled_ranks:  # every rank weighs alike
            share = 1.0 / (len(counts) * self.parallel.world_size)
            return microbatches, [share] * len(counts), None
        # With no valid label in the whole step the loss is undefined; NaN weights route it to
        # the non-finite policy.
        weights = [c / total if total else math.nan for c in counts]  # type: ignore[operator]
        return microbatches, weights, int(total)

    def _take(self, take: Callable[[], Any]) -> tuple[Any, Exception | None]:
        """Return (take(), None); under data parallelism (None, the error) when it raised: the
        caller's next collective tells every rank, and _data_failed raises it.
        """
        try:
            return take(), None
        except Exception as error:
            if not self.parallel.active:
                raise
            return None, error

    def _data_failed(self, failure: Exception | None, where: str) -> Exception:
        """Return what each rank raises once the ranks agreed that some rank's loader failed
        (`where`: which, and when): that rank its own error, every other rank one naming it.
        """
        failed = self.parallel.all_gather_object(failure is not None)
        if failure is not None:
            return failure
        ranks = ", ".join(str(rank) for rank, did in enumerate(failed) if did)
        return RuntimeError(
            f"rank {ranks} could not read its batch from the {where} (that rank's error says "
            "why); every rank stops with it"
        )

    def _accumulate(self, microbatches: list[Any], weights: list[float]) -> tuple[float, int, int]:
        """Run forward/backward over this rank's microbatches, each at its `weights` share;
        return (its share of the step loss, samples, tokens). Gradients are reduced
        across ranks on the last microbatch, or on every one where syncs_every_microbatch says so
        (FSDP2's sharded accumulation).
        """
        # DDP and FSDP average gradients over ranks; scaling by the world size turns that
        # average back into the token-weighted sum over the global batch.
        scale = float(self.parallel.world_size)
        step_loss: torch.Tensor | None = None
        samples = tokens = 0
        last = len(microbatches) - 1
        for index, (batch, weight) in enumerate(zip(microbatches, weights, strict=True)):
            n, t = batch_size_and_tokens(batch)
            samples, tokens = samples + n, tokens + t
            if weight == 0.0 and self.parallel.world_size == 1:
                continue  # every label ignored: no contribution, and its mean loss would be NaN
            batch = move_batch(batch, self.device, self._non_blocking)
            with gradient_sync(self.model, enabled=index == last or self._sync_every_microbatch):
                loss = self._forward(batch)
                # Every label ignored on this rank only: it still runs forward and backward, as
                # zero, so it joins the collectives its peers run (DDP's gradient all-reduce,
                # FSDP2's gathers); skipping alone would hang them.
                loss = loss.nan_to_num(0.0, 0.0, 0.0) * 0.0 if weight == 0.0 else loss * weight
                backward = loss * scale if scale != 1.0 else loss
                (self.scaler.scale(backward) if self.scaler is not None else backward).backward()
            step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
        # Some microbatch always ran: one process skips a label-less one only while another has
        # labels (none anywhere makes the weights NaN, not 0); under data parallelism all run.
        return float(step_loss), samples, tokens  # type: ignore[arg-type]

    def _train_step(self, stop_requested: Callable[[], str | None] = lambda: None) -> StepOutcome:
        """Run one optimizer update; a non-finite loss or gradient norm is not applied. Every
        rank learns the step's loss, size and any rank's stop request in one collective.
        """
        started = time.perf_counter()
        # A skipped update counts itself before it is recorded: a failure recording it rewinds
        # the count with the batch, or a resume would count that batch's skip again.
        self._guard.begin(
            {"data": self._stream.state_dict(), "skipped_steps": self.skipped_steps}
            if self._saves_emergency()
            else None
        )
        microbatches, weights, labels = self._step_batches()
        if not self._labels_checked:
            self._check_labels_shifted(microbatches[0])
        self.optimizer.zero_grad(set_to_none=True)
        if self._stage_scheduler is not None:
            self._stage_scheduler.begin()
        try:
            loss, samples, tokens = self._accumulate(microbatches, weights)
        finally:
            if self._stage_scheduler is not None:
                self._stage_scheduler.finish()
        received = stop_requested()
        loss, samples, tokens, terms, interrupts = self.parallel.all_reduce_sum(
            [loss, samples, tokens, *_signal_counts(received)]
        )
        grad_norm = self._clip_gradients() if math.isfinite(loss) else None
        # A scaler skips inf gradients itself; without one nothing else would stop them. Without
        # clipping the norm is still measured (not reported): a finite loss can have inf/NaN
        # gradients (sqrt at 0, an overflow in backward), which must not reach the weights.
        checked = grad_norm
        if checked is None and math.isfinite(loss) and self.scaler is None:
            checked = self._gradient_norm()
        grads_ok = checked is None or math.isfinite(checked) or self.scaler is not None
        applied = math.isfinite(loss) and grads_ok
        if not applied:
            grad_norm = checked  # what _handle_nonfinite names
        if applied:
            self._guard.updating()
        if applied and self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        elif applied:
            self.optimizer.step()
        seconds = time.perf_counter() - started
        stop = _agreed_signal(terms, interrupts)
        return StepOutcome(
            loss, grad_norm, int(samples), int(tokens), applied, seconds, stop, labels
        )

    def _check_labels_shifted(self, batch: Any) -> None:
        """Refuse, before any update, a first batch whose labels are the input ids (a
        transformers collator's labels): the model shifting labels itself is called without them,
        so it would learn to repeat its input. Agreed over the ranks: all raise, none waits. Once
        a batch passes, no other is checked (one comparison per trainer, not per step).
        """
        if not self.parallel.any(unshifted_labels(batch)):
            self._labels_checked = True
            return
        raise self._unshifted_labels_error("it would learn to repeat its input", "trainer")

    def _unshifted_labels_error(self, consequence: str, who: str) -> ValueError:
        """Return the error for labels equal to the input ids (raised alike on every rank)."""
        return on_every_rank(
            ValueError(
                f"the batch's labels equal input_ids at every labelled position: they are not "
                f"shifted, and {type(unwrap_model(self.model)).__name__} is called without "
                f"them, so {consequence}; give the {who} shifted labels "
                "(labels[:, t] = input_ids[:, t + 1], -100 at the end), as its loaders do"
            )
        )

    def _clip_gradients(self) -> float | None:
        clip = self.config.optimizer.grad_clip
        if clip is None:
            return None
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        params = self._params_with_grads()
        if not any(p.grad.is_sparse for p in params):
            return total_norm(torch.nn.utils.clip_grad_norm_(params, clip))
        # clip_grad_norm_ has no sparse kernel (an nn.Embedding(sparse=True)): coalesced, a
        # sparse gradient's norm is its stored values' norm, and scaling them scales it.
        for p in params:
            if p.grad.is_sparse:
                p.grad = p.grad.coalesce()
        norm = self._gradient_norm()
        scale = clip / (norm + 1e-6)  # clip_grad_norm_'s coefficient
        if scale < 1.0:
            for p in params:
                p.grad.mul_(scale)
        return norm

    def _params_with_grads(self) -> list[torch.Tensor]:
        return [
            p
            for group in self.optimizer.param_groups
            for p in group["params"]
            if p.grad is not None
        ]

    def _gradient_norm(self) -> float:
        """Return the global gradient norm without clipping (every rank gets the same value)."""
        params = self._params_with_grads()
        if not params:
            return 0.0
        # A sparse gradient (an nn.Embedding(sparse=True) under SGD) has no norm kernel; its
        # stored values are what could be inf/NaN.
        grads = [p.grad._values() if p.grad.is_sparse else p.grad for p in params]
        return total_norm(torch.nn.utils.get_total_norm(grads))

    def _handle_nonfinite(self, outcome: StepOutcome, consecutive: int) -> None:
        """Apply run.nonfinite_loss to a step that was not applied: raise, or record the skip."""
        self.optimizer.zero_grad(set_to_none=True)
        self.skipped_steps += 1
        what = (
            f"loss={outcome.loss}"
            if not math.isfinite(outcome.loss)
            else f"grad_norm={outcome.grad_norm}"
        )
        hint = "lower the learning rate, set optimizer.grad_clip"
        data = "check the data for fully ignored labels"
        # The loss and gradient norm were agreed on: every rank of a group raises alike.
        if self.config.run.nonfinite_loss == "stop":
            raise on_every_rank(
                NonFiniteLossError(
                    f"non-finite {what} at step {self.step + 1}; stopped without updating the "
                    f"weights or writing a checkpoint ({hint}, {data}, or set "
                    "run.nonfinite_loss: skip to skip such updates)"
                )
            )
        if consecutive >= MAX_CONSECUTIVE_SKIPS:
            raise on_every_rank(
                NonFiniteLossError(
                    f"{consecutive} consecutive non-finite updates up to step {self.step + 1}; "
                    f"the run has diverged ({hint} or {data})"
                )
            )
        # `reason` names the value that was non-finite: a finite loss can have inf/NaN gradients.
        loss_ok = math.isfinite(outcome.loss)
        # One text line per streak (up to 49 alike scrolled past); _end_skip_streak counts the
        # rest.
        quiet = self.logger.records_only() if consecutive > 1 else contextlib.nullcontext()
        with quiet:
            self.logger.emit(
                "nonfinite_skip",
                {
                    "step": self.step + 1,
                    "loss": outcome.loss,
                    "skipped_steps": self.skipped_steps,
                    "reason": "grad_norm" if loss_ok else "loss",
                    **({"grad_norm": outcome.grad_norm} if loss_ok else {}),
                },
            )

    def _end_skip_streak(self, progress: _FitProgress) -> None:
        """Say how many updates were skipped after a streak's first (theirs are records only),
        and start counting anew.
        """
        more = progress.consecutive_skips - 1
        if more > 0:
            self.logger.warning(
                "nonfinite_skip: %d more update%s skipped at step %d (%d skipped in all); each "
                "has a nonfinite_skip record in the metrics file and hooks",
                more,
                "s" if more > 1 else "",
                self.step + 1,
                self.skipped_steps,
            )
        progress.consecutive_skips = 0

    def _advance(self, outcome: StepOutcome) -> None:
        """Count an applied step: scheduler, counters, coordinator callback, optional reset."""
        if self.scheduler is not None:
            self.scheduler.step()
        self.step += 1
        self.samples += outcome.samples
        self.tokens += outcome.tokens
        if self.coordinator is not None:
            if self.coordinator.after_optimizer_step(self.model, self.step):
                self._reset_inner_optimizer()

    def _reset_inner_optimizer(self) -> None:
        """Clear the optimizer state when distributed.reset_inner_optimizer is on."""
        if self.config.distributed.reset_inner_optimizer:
            # Facades (hybrid Muon, cautious) expose a live state view whose clear() reaches
            # every child optimizer.
            self.optimizer.state.clear()

    # -------------------------------------------------------------------------------- evaluation

    def evaluate(self, max_batches: int | None = None) -> float | None:
        """Return the validation loss (mean over valid labels, or over samples for batches
        without token labels) over up to max_batches eval batches per rank, summed over every
        rank's batches; every rank stops at the shortest rank's share. Under data parallelism
        every rank calls it, with the same max_batches (each batch is a collective). None: the
        config's data.eval_steps; 0 reads no batch (the loader is not started) and returns None.
        """
        # Compared first: ranks reading different counts would wait on each other's batch
        # collectives (one reading none returns at once), and a bad value refused on one rank
        # alone would leave the others waiting. One all_gather_object a call, not per batch.
        split = self.parallel.disagreement(repr(max_batches))
        if split is not None:
            raise on_every_rank(
                ValueError(
                    f"evaluate(max_batches=...) differs between the ranks ({split}); call it with "
                    "the same max_batches on every rank: each batch is a collective"
                )
            )
        count = isinstance(max_batches, int) and not isinstance(max_batches, bool)
        if max_batches is not None and not (count and max_batches >= 0):
            raise ValueError(
                f"evaluate(max_batches={max_batches!r}) takes None (data.eval_steps batches) or "
                "a whole number of batches >= 0"
            )
        return self._evaluate(max_batches)[0]

    @torch.no_grad()
    def _evaluate(
        self,
        max_batches: int | None = None,
        stop_requested: Callable[[], str | None] = lambda: None,
    ) -> tuple[float | None, str | None]:
        """Return evaluate()'s loss and None, or None and the signal a rank received mid-window:
        then every rank ends the window at once (a scheduler's grace period may not outlast a
        whole validation pass, and a partial window's loss compares with no other).
        """
        limit = max_batches if max_batches is not None else self.config.data.eval_steps
        # No batch to read: iter() would start a DataLoader's workers for nothing, and no batch
        # collective would tell the peers of a rank whose workers failed to start (it raised in
        # one process, and was dropped under data parallelism).
        if self.eval_dataloader is None or limit == 0:
            return None, None
        restore_modes = switch_to_eval(self.model)  # each module gets its own mode back
        total = weight = 0.0
        stop = None
        batch, read = None, 0  # read: batches this evaluation took from the loader
        try:
            # A loader that cannot start (workers failing to) on one rank stops every rank at the
            # first batch's collective, as a batch it cannot read does; in one process it raises
            # here, and the model gets its modes back.
            batches, failure = self._take(partial(iter, self.eval_dataloader))
            for _ in itertools.count() if limit is None else range(limit):
                if failure is None:
                    batch, failure = self._take(partial(next, batches, None))
                received = stop_requested()
                # The first batch of a model that shifts labels itself is checked as training's
                # is: with labels equal to its input ids, val_loss would score copying the input.
                unshifted = read == 0 and not self._labels_to_model and unshifted_labels(batch)
                # One collective a batch agrees on both ends. A streamed split deals its last
                # batch to one rank only: a forward there alone would wait on peers already
                # summing (FSDP2 gathers, DDP buffer broadcasts). A loader failing on one rank
                # (see _step_batches) stops every rank.
                ended, terms, interrupts, unshifted, failed = self.parallel.all_reduce_sum(
                    [batch is None, *_signal_counts(received), unshifted, failure is not None]
                )
                if failed:
                    where = f"eval_dataloader, in the evaluation at step {self.step}"
                    raise self._data_failed(failure, where)
                if unshifted:
                    raise self._unshifted_labels_error(
                        "its val_loss would score copying the input", "eval_dataloader"
                    )
                stop = _agreed_signal(terms, interrupts)
                if ended and not read and batches is self.eval_dataloader:
                    # A one-shot iterator gives its batches to the first evaluation only; every
                    # later one would report nothing (and fit() the first one's val_loss).
                    raise ValueError(
                        "the eval_dataloader is a one-shot iterator that is exhausted; pass a "
                        "re-iterable loader (a DataLoader or a list) so every evaluation reads "
                        "the whole validation set"
                    )
                if ended or stop is not None:
                    break
                read += 1
                count = valid_label_count(batch)
                if count == 0 and self.parallel.world_size == 1:
                    continue
                # The training step's precision: on bf16 runs validation is as fast, and its
                # loss comes from the same numerics as the training loss.
                batch = move_batch(batch, self.device)  # the labels meet logits on the device
                with autocast_context(self.precision, self.device):
                    output = call_model(self.model, batch, labels=self._labels_to_model)
                    if count == 0:
                        continue  # run only to join the peers' collectives (FSDP2 gathers)
                    loss = float(loss_from_output(output, batch))
                # A batch's loss is its mean over its labels, or (float targets) its samples.
                share = float(count if count is not None else batch_size_and_tokens(batch)[0])
                total, weight = total + loss * share, weight + share
        finally:
            restore_modes()
        if stop is not None:
            return None, stop
        total, weight = self.parallel.all_reduce_sum([total, weight])
        return (total / weight if weight else None), None

    def _maybe_evaluate(
        self, stop_requested: Callable[[], str | None]
    ) -> tuple[float | None, str | None]:
        every = self.config.data.eval_every
        if self.eval_dataloader is None or every is None or self.step % every != 0:
            return None, None
        return self._evaluate_now(stop_requested)

    def _evaluate_now(
        self, stop_requested: Callable[[], str | None]
    ) -> tuple[float | None, str | None]:
        """Evaluate and log the loss; return it and the signal that cut the evaluation short."""
        val_loss, stop = self._evaluate(stop_requested=stop_requested)
        if stop is not None:
            self.logger.warning(
                "%s received during the evaluation at step %d: cut short, no val_loss",
                stop,
                self.step,
            )
        elif val_loss is not None:
            self.logger.emit("eval", {"step": self.step, "val_loss": val_loss})
        return val_loss, stop

    # ------------------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Return everything a checkpoint holds for an exact resume."""
        return {
            "format": CHECKPOINT_FORMAT,
            "step": self.step,
            "samples": self.samples,
            "tokens": self.tokens,
            "skipped_steps": self.skipped_steps,
            # FSDP2 shards go through DCP instead (speedtronic_trainer.sharded).
            **self._dense_state(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "rng": capture_rng_state(),
            "data": self._stream.state_dict(),
            "log_interval": self._metrics.state_dict(),
            "evaluation_due": self._evaluation_due,
            # Secrets never reach a checkpoint; a trainer without a config saves none.
            "config": self._config_record(),
            # What the weights belong to: config.model.name describes only models built from it.
            "model_class": model_class_name(self.model),
            "coordinator": self.coordinator.state_dict() if self.coordinator is not None else None,
            "tokenizer": self.tokenizer,
        }

    def _config_record(self) -> dict[str, Any] | None:
        """Return the config a checkpoint records (no secrets), with the learning rates a resume
        kept from its checkpoint in place of the ones this run's config asked for.
        """
        if not self._config_given:
            return None
        # Plain data: a Dataset object in data.dataset would be pickled into every checkpoint,
        # and weights-only loading refuses it (no checkpoint of the run would resume).
        values = plain_data(self.config.to_dict(redact_secrets=True))
        values["optimizer"].update(self._kept_rates)
        return values

    def _log_config(self) -> None:
        """Give the logger's hooks the config this run's checkpoints record (W&B's run config,
        TensorBoard's hparams), once: at the first fit, after any resume kept its rates.
        """
        self._config_logged = True
        record = self._config_record()
        # A logger of the caller's own, duck-typed as 2.0 allowed, may not have it.
        log_config = getattr(self.logger, "log_config", None)
        if record is not None and callable(log_config):
            log_config(record)

    def _warn_if_never_evaluated(self) -> None:
        """Say that a validation set goes unevaluated without data.eval_every: fit() evaluates
        neither on an interval nor after its last step, and the run reports no val_loss.
        """
        if self.eval_dataloader is not None and self.config.data.eval_every is None:
            self.logger.warning(
                "data.eval_every is not set: fit() never evaluates the eval_dataloader "
                "(data.val_shard_path or data.val_text_path), not even after its last step, and "
                "reports no val_loss; set data.eval_every to evaluate every N steps and at the end"
            )

    def _dense_state(self) -> dict[str, Any]:
        if self.parallel.mode == "fsdp":
            return {}
        return {
            "model": unwrap_model(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }

    def _checkpoint(self, *, force: bool = False) -> Path | None:
        manager = self.checkpoint_manager
        if manager is None or not manager.enabled:
            return None
        if not (force or manager.should_save(self.step)):
            return None
        if self.parallel.mode == "none":
            path = manager.save(self.step, self.state_dict())
        else:
            path = self._checkpoint_ranks(manager)
        self.last_checkpoint = path
        self.logger.emit("checkpoint", {"step": self.step, "path": str(path)})
        return path

    def _checkpoint_ranks(self, manager: CheckpointManager) -> Path:
        """Save under data parallelism: the full state once (DDP: rank 0's file) or every rank's
        shards (FSDP: DCP), each rank's RNG and data position, and move `latest` only after every
        rank has finished.
        """
        state = self.state_dict()
        state["rank_states"] = self.parallel.all_gather_object(
            {"rng": state.pop("rng"), "data": state.pop("data")}
        )
        state["world_size"] = self.parallel.world_size
        if self.parallel.mode == "fsdp":
            path = manager.sharded_path_for(self.step)
            staging = manager.sharded_staging_for(self.step)
            if self.parallel.is_main:  # what a killed save left; gone before any rank writes
                shutil.rmtree(staging, ignore_errors=True)
            self.parallel.barrier()
            try:
                save_sharded(staging, self.model, self.optimizer)
            except OSError as error:  # raised alike on every rank (DCP gathers the failures)
                if self.parallel.is_main:  # the shards written so far: room on a full disk
                    shutil.rmtree(staging, ignore_errors=True)
                raise on_every_rank(manager.write_failure(error, path)) from error
            publish = partial(manager.publish_sharded, staging, state)
        else:
            path = manager.path_for(self.step)
            publish = partial(manager.write, path, state)
        self._on_main_agreed(publish, f"write checkpoint {path}")
        self._on_main_agreed(lambda: manager.commit(path), f"point `latest` at {path}")
        return path

    def _on_main_agreed(self, action: Callable[[], object], what: str) -> None:
        """Run `action` on rank 0 while the others wait; when it fails there, raise on every
        rank (rank 0 its own error, the others a CheckpointError), so no rank trains on alone.
        """
        error: Exception | None = None
        if self.parallel.is_main:
            try:
                action()
            except Exception as exc:
                error = exc
        if self.parallel.any(error is not None):
            raise error or CheckpointError(f"rank 0 failed to {what}; its log says why")

    def resume(self, state: dict[str, Any] | None) -> None:
        """Restore a checkpoint state (from CheckpointManager.load_latest); None warns and starts
        fresh.
        """
        if state is None:
            self.logger.warning(
                "resume requested but no checkpoint was found; starting from step %d", self.step
            )
            return
        check_tokenizer(state, self.tokenizer)
        check_settings(state, self.config if self._config_given else None)
        built = group_settings(self.optimizer)
        self._restore_weights(state)
        self._warn_if_settings_kept(built)
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
            _apply_schedule(self.scheduler)
            self._warn_if_lr_kept(state)
            self._warn_if_horizon_moved(state)
        self._warn_if_data_changed(state)
        if self.scaler is not None and state.get("scaler") is not None:
            self.scaler.load_state_dict(state["scaler"])
        if self.coordinator is not None and state.get("coordinator") is not None:
            self.coordinator.load_state_dict(state["coordinator"])
        self.step = int(state["step"])
        self.samples = int(state.get("samples", 0))
        self.tokens = int(state.get("tokens", 0))
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self._metrics.load_state_dict(state.get("log_interval"))
        self._evaluation_due = bool(state.get("evaluation_due", False))
        self._restore_rank_state(state)
        if state.get("checkpoint_path") is not None:
            self.last_checkpoint = Path(state["checkpoint_path"])
        self.logger.info(
            "resumed at step %d from %s",
            self.step,
            state.get("checkpoint_path", "a state dict"),
        )
        # A logger of the caller's own, duck-typed as 2.0 allowed, may not have it.
        resumed = getattr(self.logger, "resumed_at", None)
        if callable(resumed):
            resumed(self.step)

    def _warn_if_lr_kept(self, state: dict[str, Any]) -> None:
        """Say so when this run's optimizer.lr (or adamw_lr) differs from the checkpoint's: the
        restored scheduler state holds the checkpoint's base learning rates, and they stay.
        """
        if not self._config_given:
            return
        saved = (state.get("config") or {}).get("optimizer") or {}
        current = self.config.optimizer
        rates = [("lr", saved.get("lr"), current.lr)]
        if saved.get("adamw_lr") is not None or current.adamw_lr is not None:
            # Unset, Muon's AdamW branch runs at lr: compare the rates each run really used.
            rates.append(
                (
                    "adamw_lr",
                    saved.get("adamw_lr") or saved.get("lr"),
                    current.adamw_lr or current.lr,
                )
            )
        for name, before, now in rates:
            if before is not None and before != now:
                self._kept_rates[name] = before
                self.logger.warning(
                    "optimizer.%s %g is not applied on resume: the schedule continues at the "
                    "checkpoint's %g (its state holds the base learning rates); to go on from "
                    "these weights at %g, export them (speedtronic export CHECKPOINT DIR --format "
                    "hf) and start a new run with model.init_from: hf:DIR",
                    name,
                    now,
                    before,
                    now,
                )

    def _warn_if_settings_kept(self, built: list[dict[str, Any]]) -> None:
        """Say which of this run's optimizer settings the checkpoint overrode: torch restores each
        parameter group's hyperparameters (weight decay, betas, momentum, ...) with its state.
        `built` is what this run's config gave the groups before the load.
        """
        kept: dict[str, tuple[Any, Any]] = {}
        # restore_optimizer checked that the group counts agree.
        for mine, restored in zip(built, group_settings(self.optimizer), strict=True):
            for key, value in mine.items():
                if key in restored and not _same_setting(value, restored[key]):
                    kept.setdefault(key, (value, restored[key]))
        if kept:
            self.logger.warning(
                "optimizer settings not applied on resume, the checkpoint's continue: %s; to go "
                "on from these weights with them, export them (speedtronic export CHECKPOINT DIR "
                "--format hf) and start a new run with model.init_from: hf:DIR",
                ", ".join(
                    f"{self._setting_name(key)} {now!r} (checkpoint: {was!r})"
                    for key, (now, was) in kept.items()
                ),
            )

    def _setting_name(self, key: str) -> str:
        """Return the config path a user sets a parameter-group key with, or the key itself where
        no optimizer field sets it. The hybrid takes Muon's keywords with a `muon_` prefix
        (`ns_steps` is set by optimizer.muon_ns_steps).
        """
        if not self._config_given:
            return key
        section = self.config.optimizer
        for name in (key, f"muon_{key}"):
            if hasattr(section, name):
                return f"optimizer.{name}"
        return key

    def _warn_if_horizon_moved(self, state: dict[str, Any]) -> None:
        """Say so when the schedule's horizon differs from the checkpoint's (an unset
        scheduler.max_steps follows the step target, which --max-steps moves): the learning rate
        follows the new horizon from the resumed step, so a schedule that had decayed rises again.
        """
        current = self.config.scheduler
        if not self._config_given or current.name == "constant":
            return
        if self.max_steps is not None and self.max_steps <= int(state.get("step", 0)):
            return  # a target at or below the checkpoint trains no step under the new horizon
        try:
            saved = SpeedtronicConfig.from_dict(state.get("config") or {}).scheduler.max_steps
        except (ConfigError, TypeError, ValueError):  # a config this version cannot read
            return
        if saved != current.max_steps:
            self.logger.warning(
                "the %s schedule's horizon is %d steps here but %d in the checkpoint: the "
                "learning rate follows the new horizon from step %d (after a decay, it rises "
                "again); set scheduler.max_steps=%d to keep the checkpoint's schedule",
                current.name,
                current.max_steps,
                saved,
                int(state.get("step", 0)),
                saved,
            )

    def _warn_if_data_changed(self, state: dict[str, Any]) -> None:
        """Say so for each data setting that orders or sizes the batches and differs from the
        checkpoint's: the restored position counts the checkpoint's batches, so the data does
        not continue exactly where it stopped. Another micro_batch_size is not named where the
        loader resumes at the saved sample anyway (a ResumableLoader, see
        BatchStream.resumes_exactly).
        """
        if not self._config_given:
            return
        saved = (state.get("config") or {}).get("data") or {}
        current = self.config.data
        mine = self._rank_state(state)
        exact = mine is not None and self._stream.resumes_exactly(mine.get("data"))
        synthetic = trains_on_synthetic(saved) and trains_on_synthetic(current)
        for name in DATA_ORDER_FIELDS:
            if name == "micro_batch_size" and exact:
                continue
            if name == "num_tokens" and not synthetic:  # the size of synthetic data alone
                continue
            # Compared as saved: a path object as its string, a Dataset object not at all.
            if name in saved and saved[name] != plain_data(getattr(current, name)):
                self.logger.warning(
                    "data.%s is %r here but %r in the checkpoint: the restored data position "
                    "counts the checkpoint's batches, so this run does not continue the data "
                    "exactly where it stopped",
                    name,
                    getattr(current, name),
                    saved[name],
                )

    def _restore_weights(self, state: dict[str, Any]) -> None:
        """Load the model and optimizer: FSDP shards through DCP (any world size), else the
        state dict every rank reads from the same file (an FSDP2 model keeps its shards of it).
        """
        # One line naming the mismatch and the fix (another model size or optimizer).
        config = self.config if self._config_given else None
        if "sharded" in state:
            path = Path(state["sharded"])
            # Checked by the names and shapes its .metadata records, as a file's weights are.
            weights = sharded_model_weights(path)
            check_model_fits(unwrap_model(self.model), {**state, "model": weights}, config)
            load_sharded(path, self.model, self.optimizer)
            return
        missing = [key for key in ("step", "model", "optimizer") if key not in state]
        if missing:
            raise ValueError(
                f"checkpoint state lacks {missing}; it was not written by this trainer"
            )
        # A model its user compiled was saved through its OptimizedModule before unwrap_model
        # saw through torch.compile: its keys carry the wrapper's `_orig_mod.` prefix.
        if state["model"] and all(key.startswith(_COMPILED_PREFIX) for key in state["model"]):
            weights = state["model"].items()
            state = {**state, "model": {k.removeprefix(_COMPILED_PREFIX): v for k, v in weights}}
        sharded = self.parallel.mode == "fsdp"
        load = load_full_model_state if sharded else torch.nn.Module.load_state_dict
        # Checked, then the optimizer (put back if refused), then the weights: a checkpoint
        # refused for either leaves this trainer as it was.
        check_model_fits(unwrap_model(self.model), state, config)
        restore_optimizer(self.optimizer, state, config)
        load(unwrap_model(self.model), state["model"])
        if sharded:
            shard_optimizer_state(self.optimizer)

    def _rank_state(self, state: dict[str, Any]) -> dict[str, Any] | None:
        """Return this rank's saved {"rng", "data"}; None when the checkpoint was saved at
        another world size.
        """
        ranks = state.get("rank_states") or [{"rng": state.get("rng"), "data": state.get("data")}]
        return ranks[self.parallel.rank] if len(ranks) == self.parallel.world_size else None

    def _restore_rank_state(self, state: dict[str, Any]) -> None:
        """Restore this rank's RNG and data position; at another world size the data restarts
        its epoch (the shares of the data differ), with a warning.
        """
        mine = self._rank_state(state)
        if mine is None:
            self.logger.warning(
                "checkpoint saved at world size %d, resuming at %d: weights and optimizer state "
                "are restored; the data restarts from the beginning of an epoch",
                len(state.get("rank_states") or [state]),  # without them: one rank's
                self.parallel.world_size,
            )
            return
        if mine.get("data") is not None:
            # A loader warns when the data changed since the checkpoint: said in the run's log.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self._stream.load_state_dict(mine["data"])
            for warning in caught:
                self.logger.warning("%s", warning.message)
        restore_rng_state(mine.get("rng"))
        self._warn_if_seed_kept(state)

    def _warn_if_seed_kept(self, state: dict[str, Any]) -> None:
        """Say so when this run's run.seed differs from the checkpoint's: its random state was
        just restored, so the new seed draws nothing (data.seed, which orders the data, is named
        by _warn_if_data_changed).
        """
        saved = ((state.get("config") or {}).get("run") or {}).get("seed")
        if not self._config_given or saved is None or saved == self.config.run.seed:
            return
        self.logger.warning(
            "run.seed %d is not applied on resume: the checkpoint's random state continues (its "
            "run was seeded with %d); to draw with seed %d, export these weights (speedtronic "
            "export CHECKPOINT DIR --format hf) and start a new run with model.init_from: hf:DIR",
            self.config.run.seed,
            saved,
            self.config.run.seed,
        )

    def resume_latest(self) -> bool:
        """Resume from the checkpoint manager's newest valid checkpoint; return whether one was
        loaded. Under data parallelism every rank must find the same one.
        """
        if self.checkpoint_manager is None:
            raise ValueError("resume_latest() needs a checkpoint_manager")
        error: Exception | None = None
        try:
            state = self.checkpoint_manager.load_latest(warn=self.logger.warning)
        except CheckpointError as exc:  # agreed on first: the other ranks must not wait for us
            state, error, found = None, exc, "no loadable checkpoint"
        except OSError as exc:  # a folder this node cannot list (permissions, a symlink loop)
            if not self.parallel.active:
                raise
            reason = exc.strerror or type(exc).__name__
            state, error, found = None, exc, f"an unreadable folder ({reason})"
        if error is None:
            found = "none" if state is None else Path(state["checkpoint_path"]).name
        self._agree_on_checkpoint(found, self.checkpoint_manager.directory)
        if error is not None:
            raise error
        if state is not None:
            self._agree_on_copy(Path(state["checkpoint_path"]))
        try:
            self.resume(state)
        except CheckpointError as refused:  # the agreed checkpoint against the same settings
            on_every_rank(refused)  # (DCP's load gathers every rank's failure alike)
            raise
        return state is not None

    def _agree_on_checkpoint(self, found: str, folder: Path) -> None:
        """Raise CheckpointError on every rank when the ranks found different checkpoints (a
        node without the shared checkpoint folder, or one that could not read it): resumed
        apart, they would train different models or wait for each other forever.
        """
        split = self.parallel.disagreement(found)
        if split is None:
            return
        raise on_every_rank(
            CheckpointError(
                f"the ranks found different checkpoints to resume ({split}); every node must see "
                f"the same checkpoint folder {folder}: put it on a filesystem all nodes share, or "
                "copy it to each node"
            )
        )

    def _agree_on_copy(self, path: Path) -> None:
        """Raise CheckpointError on every rank when the ranks' copies of the checkpoint they
        agreed on differ (a node holding another save of that step under the same name): DDP
        broadcasts rank 0's weights only when it wraps the model, before a resume loads them, so
        each rank would train on from its own copy; FSDP2's would join shards of two saves.
        """
        if not self.parallel.active:
            return
        try:
            digest = checkpoint_digest(path)
        except OSError as error:  # raised here on one rank, it would leave the others waiting
            digest = f"unreadable ({error.strerror or type(error).__name__})"
        split = self.parallel.disagreement(digest)
        if split is None:
            return
        raise on_every_rank(
            CheckpointError(
                f"the ranks hold different copies of {path.name} (contents {split}): another "
                f"save of that step is on some node; give every node the same copy of "
                f"{path.parent}, or put it on a filesystem all nodes share"
            )
        )

    # -------------------------------------------------------------------------------------- fit

    def _target(self, max_steps: int | None) -> int:
        requested = max_steps if max_steps is not None else self.max_steps
        if requested is None:
            raise ValueError(
                "no step target: pass max_steps to Trainer(...) or fit(...), or give a config "
                "(run.max_steps)"
            )
        if requested <= 0:
            raise ValueError(
                f"max_steps must be a positive absolute step target, got {requested!r}"
            )
        return max(self.step, int(requested))

    def fit(self, max_steps: int | None = None) -> TrainResult:
        """Train until the absolute step target; return what was done."""
        target = self._agree_on_plan(max_steps)
        self.emergency_checkpoint = None
        if target == self.step:
            # The same fields as a run's result: a script that reads them must not fail (KeyError)
            # when it runs again after its target was reached.
            idle = {"tokens_per_s": 0.0, "samples_per_s": 0.0}
            return TrainResult(
                self.step,
                self.samples,
                self.tokens,
                None,
                0.0,
                idle,
                skipped_steps=self.skipped_steps,
            )
        if not self._config_logged:  # the first fit
            self._log_config()
            self._warn_if_never_evaluated()
        if not self._compile_decided:
            self._decide_compile(target - self.step)
        if not unwrap_model(self.model).training:
            # Left as given (a module may keep parts in eval mode on purpose), but never silently:
            # transformers' from_pretrained returns its models in eval mode.
            self.logger.warning(
                "%s is in eval mode (model.eval(), or transformers' from_pretrained): fit() "
                "trains it so, with dropout off and batch-norm statistics frozen; call "
                "model.train() before fit() to train in training mode",
                type(unwrap_model(self.model)).__name__,
            )
        started = time.perf_counter()
        first = (self.step, self.samples, self.tokens)
        progress = _FitProgress()
        bar = ProgressBar(
            total=target,
            initial=self.step,
            enabled=self.parallel.is_main and progress_enabled(self.config.logging.progress),
        )
        console_metrics = self.logger.console_metrics
        # The bar stands in for the per-step lines only on the terminal that shows it: stdout
        # redirected to a file while the bar draws on stderr's terminal keeps every line.
        on_terminal = bar.active and is_terminal(self.logger.stream)
        self.logger.console_metrics = console_metrics and not on_terminal
        try:
            # save_on_signal: false leaves the signals alone, as 2.0 did (KeyboardInterrupt,
            # or death by SIGTERM): a graceful stop exists to write the checkpoint.
            with StopSignal(
                enabled=self.config.checkpoint.save_on_signal,
                on_signal=getattr(self.coordinator, "interrupt", None),
                repeat_exits=not torchrun_worker(),
            ) as stop:
                if self.coordinator is not None:
                    # Under the handlers: a signal ends its wait for a first global model.
                    self.coordinator.start()
                    # A coordinator that installed a global at start (a resumed DiLoCo node) asks
                    # for the reset a boundary install gets.
                    if getattr(self.coordinator, "reset_after_start", False):
                        self._reset_inner_optimizer()
                    progress.stopped_by = self._agreed_stop(stop.received)
                if self._evaluation_due and progress.stopped_by is None:
                    progress.stopped_by = self._run_due_evaluation(progress, stop)
                while self.step < target and progress.stopped_by is None:
                    outcome = self._run_step(progress, bar, lambda: stop.received)
                    progress.stopped_by = self._stop_reason(stop.received, outcome)
                # Still under the handlers: a signal during the last evaluation ends it, and one
                # during the last save lets it finish.
                self._finish(progress, lambda: stop.received, first_step=first[0])
        except Exception as error:
            self._save_emergency(error, started_at=first[0])
            raise
        finally:
            bar.close()
            self.logger.console_metrics = console_metrics
            if self.coordinator is not None:
                self.coordinator.stop()
        return self._result(progress, first, time.perf_counter() - started)

    def _run_due_evaluation(self, progress: _FitProgress, stop: StopSignal) -> str | None:
        """Run the evaluation a signal cut short at this step; return the signal that cuts it
        short again. The random state is put back: the stopped run's checkpoint holds the state
        its cut evaluation left, which this one would move again (a DataLoader draws a seed each
        pass).
        """
        rng = capture_rng_state()
        val_loss, stopped_by = self._evaluate_now(lambda: stop.received)
        restore_rng_state(rng)
        progress.evaluated(val_loss, self.step)
        self._evaluation_due = stopped_by is not None
        return stopped_by

    def _agree_on_plan(self, max_steps: int | None) -> int:
        """Return fit()'s step target; raise ValueError on every rank when the ranks' fit() calls
        would run different collectives: another step target or first step (one rank stops first
        and saves alone), a target one rank refuses, or an evaluation or checkpoint interval some
        ranks lack (theirs are collectives the others never join). One all_gather_object per
        fit().
        """
        if not self.parallel.active:
            return self._target(max_steps)
        try:
            target, refused = self._target(max_steps), None
        except ValueError as error:
            target, refused = None, error
        every, manager = self.config.data.eval_every, self.checkpoint_manager
        evaluates = self.eval_dataloader is not None and every is not None
        saves = manager is not None and manager.enabled
        plan = {
            # A refused target is agreed on as its reason: alone, that rank left its peers here.
            "step target": target if refused is None else f"invalid ({refused})",
            "first step": self.step,
            "evaluation": f"every {every} steps" if evaluates else "none",
            "checkpoints": f"every {manager.every_steps} steps" if saves else "none",
        }
        differ = self.parallel.disagreements(plan)
        if refused is not None and not differ:  # every rank refused the same target
            raise on_every_rank(refused)
        if not differ:
            return target
        name, split = next(iter(differ.items()))  # the first in plan's order
        raise on_every_rank(
            ValueError(
                f"the ranks' fit() calls differ in their {name} ({split}): they would wait for "
                "each other or pair up different collectives; call fit() with the same max_steps "
                "on every rank, and give every rank its share of the eval_dataloader and the same "
                "checkpoint_manager (every rank takes part in each evaluation and save)"
            )
        )

    def _agreed_stop(self, received: str | None) -> str | None:
        """Return the signal any rank received, on every rank alike (one collective)."""
        if not self.parallel.active:
            return received
        terms, interrupts = self.parallel.all_reduce_sum(_signal_counts(received))
        return _agreed_signal(terms, interrupts)

    def _stop_reason(self, received: str | None, outcome: StepOutcome) -> str | None:
        """Return the signal that stops the run after this step, decided alike on every rank."""
        if self.parallel.active:
            return outcome.stop
        return received

    def _run_step(
        self, progress: _FitProgress, bar: ProgressBar, stop_requested: Callable[[], str | None]
    ) -> StepOutcome:
        """One optimizer step and what follows it: metrics, evaluation, a due checkpoint."""
        outcome = self._train_step(stop_requested)
        if not outcome.applied:
            progress.consecutive_skips += 1
            self._handle_nonfinite(outcome, progress.consecutive_skips)
            return outcome
        self._end_skip_streak(progress)
        # The rates this step trained at: _advance's scheduler.step() sets the next step's.
        rates = (self.optimizer.param_groups[0]["lr"], adamw_branch_lr(self.optimizer))
        self._advance(outcome)
        self._guard.applied()
        progress.final_loss = outcome.loss
        self._log_step(outcome, rates)
        tokens_per_s = outcome.tokens / outcome.seconds if outcome.seconds > 0 else 0.0
        bar.update(self.step, outcome.loss, tokens_per_s)
        evaluated, stop = self._maybe_evaluate(stop_requested)
        progress.evaluated(evaluated, self.step)
        if stop is not None:  # every rank stops now, not after another step
            outcome = replace(outcome, stop=stop)
            self._evaluation_due = True  # before the checkpoints of this step are written
        written = self._checkpoint()
        if written is not None:
            progress.checkpoint, progress.checkpoint_step = written, self.step
        return outcome

    def _save_emergency(self, error: Exception, *, started_at: int) -> None:
        """After a failure mid-run, checkpoint the last sound state (never over this trainer's own
        checkpoint of that step) and log where it is; a failed checkpoint write or a non-finite
        loss saves nothing, nor does a fit that completed no step (it started from a checkpoint
        already written, or from a fresh initialization). Never raises: the original failure is
        what the caller must see.
        """
        manager = self.checkpoint_manager
        skip = isinstance(error, (CheckpointError, NonFiniteLossError))  # disk failed; policy
        if manager is None or not manager.enabled or skip or self.step == started_at:
            self._guard.applied()
            return
        failed_at = f"{type(error).__name__} at step {self._guard.failing_step(self.step)}"
        if not self._saves_emergency():
            self._guard.applied()
            self.logger.error(
                "%s: no emergency checkpoint under data parallelism; resume from %s",
                failed_at,
                # Not latest_path(): that may be an earlier run's, which this run started beside.
                self.last_checkpoint or "the start (this run wrote no checkpoint)",
            )
            return
        try:
            state = self._guard.sound_state(self.model, self.state_dict)
            if state is None:
                self.logger.error("%s: the model may be half-updated or non-finite", failed_at)
                return
            path = manager.path_for(state["step"])
            # This trainer's own save of the step already is the state; a file of that step from
            # an earlier run in the folder is not, and is replaced as a regular save would.
            if path != self.last_checkpoint:
                # Not pruned: every checkpoint from before the failure stays.
                path = manager.save(state["step"], state, prune=False)
            self.emergency_checkpoint = path
            step = state["step"]
            self.logger.error("%s; emergency checkpoint of step %d: %s", failed_at, step, path)
        except Exception as failure:  # e.g. the log file is on the disk that just filled up
            try:
                self.logger.error("%s; emergency checkpoint failed: %s", failed_at, failure)
            except Exception:
                pass
        finally:
            self._guard.applied()  # a later fit() starts between steps

    def _saves_emergency(self) -> bool:
        """Return whether a failure mid-run can be checkpointed: in one process only. Saving
        under data parallelism needs every rank (gathered RNG, FSDP shards), and after a failure
        on one rank the others may be blocked in a collective, so trying would hang; even a
        one-rank FSDP group keeps its weights out of the dense state.
        """
        manager = self.checkpoint_manager
        return manager is not None and manager.enabled and self.parallel.mode == "none"

    def _log_step(self, outcome: StepOutcome, rates: tuple[float, float | None]) -> None:
        """Count the step into the logging interval; emit the interval's record when it is due
        (a single step's loss is too noisy to plot). `rates`: the step's lr and AdamW-branch lr.
        """
        self._metrics.add(
            loss=outcome.loss,
            samples=outcome.samples,
            tokens=outcome.tokens,
            seconds=outcome.seconds,
            labels=outcome.labels,
        )
        if not self.logger.wants_step(self.step):
            return
        record = self._metrics.record(
            step=self.step,
            loss=outcome.loss,
            lr=rates[0],
            grad_norm=outcome.grad_norm,
            lr_adamw=rates[1],
        )
        self.logger.emit("train_step", record)

    def _finish(
        self,
        progress: _FitProgress,
        stop_requested: Callable[[], str | None],
        *,
        first_step: int,
    ) -> None:
        """After the loop: a last evaluation when due (a signal cuts it short and stops the run),
        then the on-signal checkpoint or the final one, unless this step was just saved.
        """
        self._end_skip_streak(progress)  # a signal can stop the run mid-streak
        written_now = progress.checkpoint_step == self.step
        every = self.config.data.eval_every
        last_evaluation = self.eval_dataloader is not None and every is not None
        if progress.stopped_by is None and last_evaluation and self.step % every:
            # The run's summary reports the validation loss of the weights it ends with.
            val_loss, progress.stopped_by = self._evaluate_now(stop_requested)
            progress.evaluated(val_loss, self.step)
        if progress.stopped_by is not None:
            if not written_now:
                progress.checkpoint = self._checkpoint(force=True) or progress.checkpoint
            self.logger.warning("%s received: stopped at step %d", progress.stopped_by, self.step)
            return
        if self.config.checkpoint.save_final and self.step > first_step and not written_now:
            progress.checkpoint = self._checkpoint(force=True) or progress.checkpoint

    def _result(
        self, progress: _FitProgress, first: tuple[int, int, int], elapsed: float
    ) -> TrainResult:
        first_step, first_samples, first_tokens = first
        per_s = 1.0 / elapsed if elapsed > 0 else 0.0
        metrics = {
            "tokens_per_s": (self.tokens - first_tokens) * per_s,
            "samples_per_s": (self.samples - first_samples) * per_s,
        }
        # Only the loss of the weights the run ends with: a signal that stopped it before (or
        # during) their evaluation leaves an earlier one, which its own `eval` record keeps.
        if progress.val_loss is not None and progress.val_step == self.step:
            metrics["val_loss"] = progress.val_loss
        self.logger.emit(
            "fit_end",
            {
                "step": self.step,
                "final_loss": progress.final_loss,
                "elapsed_s": elapsed,
                **metrics,
            },
        )
        failures = sum(self.logger.hook_failures.values())  # fit_end's own delivery included
        if failures:
            metrics["hook_failures"] = failures
        return TrainResult(
            self.step,
            self.samples,
            self.tokens,
            progress.final_loss,
            elapsed,
            metrics,
            steps_run=self.step - first_step,
            skipped_steps=self.skipped_steps,
            stopped_by=progress.stopped_by,
            checkpoint=progress.checkpoint,
        )

    def close(self) -> None:
        """Release the stage-stream scheduler's hooks; the trainer can still fit eagerly
        afterwards.
        """
        if self._stage_scheduler is not None:
            self._stage_scheduler.dispose()
            self._stage_scheduler = None


__all__ = [
    "NonFiniteLossError",
    "StepOutcome",
    "SyncCoordinator",
    "TrainResult",
    "Trainer",
]
