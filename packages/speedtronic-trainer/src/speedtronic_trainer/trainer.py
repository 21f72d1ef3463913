"""Architecture-neutral training loop."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from speedtronic_config import SpeedtronicConfig
from speedtronic_systems.precision import (
    PrecisionPlan,
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
    valid_label_count,
)
from speedtronic_trainer.checkpoint import CheckpointManager, capture_rng_state, restore_rng_state
from speedtronic_trainer.checkpoint_checks import CheckpointError, restore_model, restore_optimizer
from speedtronic_trainer.data_position import BatchStream
from speedtronic_trainer.emergency import StepGuard
from speedtronic_trainer.metric_logger import MetricLogger
from speedtronic_trainer.metrics import StepMetrics
from speedtronic_trainer.preemption import StopSignal
from speedtronic_trainer.progress import ProgressBar, progress_enabled

CHECKPOINT_FORMAT = 1
# A "skip" policy that keeps meeting non-finite losses is a diverged run, not a bad batch.
MAX_CONSECUTIVE_SKIPS = 50


class NonFiniteLossError(RuntimeError):
    """The loss or gradient norm was NaN/inf and the policy is `stop` (or too many steps were
    skipped).
    """


class SyncCoordinator(Protocol):
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


@dataclass
class StepOutcome:
    """One optimizer step: its loss and gradient norm, what it consumed, whether it was applied."""

    loss: float
    grad_norm: float | None
    samples: int
    tokens: int
    applied: bool
    seconds: float = 0.0


@dataclass
class _FitProgress:
    """What fit() tracks across steps: the latest losses, the checkpoint, a stop signal."""

    final_loss: float | None = None
    val_loss: float | None = None
    checkpoint: Path | None = None
    stopped_by: str | None = None
    consecutive_skips: int = 0


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
    ) -> None:
        self._config_given = config is not None
        self.config = _as_config(config)
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.optimizer = optimizer
        self.dataloader = dataloader
        self.eval_dataloader = eval_dataloader
        self.scheduler = scheduler
        self.logger = logger if logger is not None else MetricLogger()
        self.checkpoint_manager = checkpoint_manager
        self.coordinator = coordinator
        # Without a config there is no implicit target: fit() must be told how far to go.
        default_target = self.config.step_target if self._config_given else None
        self.max_steps = max_steps if max_steps is not None else default_target
        self.step = start_step
        self.samples = 0
        self.tokens = 0
        self.skipped_steps = 0
        if precision is None:
            precision = resolve_precision(self.config.precision, self.device)
        self.precision = precision
        self.scaler = make_grad_scaler(precision)
        if shape_report is None:
            shape_report = validate_startup_shapes(
                config, self.model, self.device, precision, logger=self.logger
            )
        self.shape_report = shape_report
        self._stream = BatchStream(dataloader)
        self._guard = StepGuard()
        self.emergency_checkpoint: Path | None = None  # written when fit() failed mid-run
        self._compiled: Any | None = None
        self._compiled_ok = False
        self._stage_scheduler: Any | None = None
        self._metrics = StepMetrics(self.model, self.device, self.precision)
        self._non_blocking = self.device.type == "cuda"
        self._configure_features()

    def accumulation_steps(self) -> int:
        """Return how many microbatches make one optimizer update."""
        return self.config.accumulation_steps

    # ----------------------------------------------------------------------------------- features

    def _configure_features(self) -> None:
        if self.config.gradient_checkpointing:
            self._enable_gradient_checkpointing()
        if self.config.ooo_backprop:
            from speedtronic_systems.scheduling import StageStreamScheduler

            self._stage_scheduler = StageStreamScheduler(
                self.model, self.device, num_streams=self.config.ooo_streams, logger=self.logger
            )
        if self.config.compile:
            self._enable_compile()

    def _enable_gradient_checkpointing(self) -> None:
        hook = getattr(self.model, "set_gradient_checkpointing", None)
        if not callable(hook):
            self.logger.warning(
                "gradient_checkpointing is on but %s has no set_gradient_checkpointing(enabled) "
                "hook; training without it",
                type(self.model).__name__,
            )
            return
        try:
            hook(True)
        except Exception as exc:  # a capability, not a requirement: degrade and say so
            self.logger.warning(
                "set_gradient_checkpointing(True) failed (%s: %s); training without it",
                type(exc).__name__,
                exc,
            )

    def _enable_compile(self) -> None:
        try:
            self._compiled = torch.compile(self.model)
        except Exception as exc:
            self.logger.warning(
                "torch.compile failed (%s: %s); training eagerly", type(exc).__name__, exc
            )
            self._compiled = None

    # --------------------------------------------------------------------------------- forward

    def _forward(self, batch: Any) -> torch.Tensor:
        """Return the microbatch loss, falling back to eager once if the compiled model fails on
        first use.
        """
        if self._compiled is not None:
            try:
                with autocast_context(self.precision, self.device):
                    loss = loss_from_output(call_model(self._compiled, batch), batch)
                self._compiled_ok = True
                return loss
            except Exception as exc:
                if self._compiled_ok:
                    raise  # the compiled path worked before: this is a model or data error
                self.logger.warning(
                    "compiled model failed on first run (%s: %s); training eagerly",
                    type(exc).__name__,
                    exc,
                )
                self._compiled = None
        with autocast_context(self.precision, self.device):
            return loss_from_output(call_model(self.model, batch), batch)

    # ------------------------------------------------------------------------------------ step

    @staticmethod
    def _microbatch_weights(microbatches: list[Any]) -> list[float]:
        """Return each microbatch's share of the update: its valid-label share when labels exist,
        else 1/k.
        """
        counts = [valid_label_count(b) for b in microbatches]
        if any(c is None for c in counts):
            return [1.0 / len(microbatches)] * len(microbatches)
        total = sum(counts)  # type: ignore[arg-type]
        # With no valid label in the whole step the loss is undefined; NaN weights route it to
        # the non-finite policy.
        return [c / total if total else math.nan for c in counts]  # type: ignore[operator]

    def _accumulate(self, microbatches: list[Any]) -> tuple[float, int, int]:
        """Run forward/backward over the microbatches; return (weighted loss, samples, tokens)."""
        step_loss: torch.Tensor | None = None
        samples = tokens = 0
        for batch, weight in zip(microbatches, self._microbatch_weights(microbatches), strict=True):
            n, t = batch_size_and_tokens(batch)
            samples, tokens = samples + n, tokens + t
            if weight == 0.0:
                continue  # every label ignored: no contribution, and its mean loss would be NaN
            batch = move_batch(batch, self.device, self._non_blocking)
            loss = self._forward(batch) * weight
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
        return (float(step_loss) if step_loss is not None else math.nan), samples, tokens

    def _train_step(self) -> StepOutcome:
        """Run one optimizer update; a non-finite loss or gradient norm is not applied."""
        started = time.perf_counter()
        self._guard.begin(self._stream.state_dict())
        microbatches = [next(self._stream) for _ in range(self.config.accumulation_steps)]
        self.optimizer.zero_grad(set_to_none=True)
        if self._stage_scheduler is not None:
            self._stage_scheduler.begin()
        try:
            loss, samples, tokens = self._accumulate(microbatches)
        finally:
            if self._stage_scheduler is not None:
                self._stage_scheduler.finish()
        grad_norm = self._clip_gradients() if math.isfinite(loss) else None
        # A scaler skips inf gradients itself; without one nothing else would stop them.
        grads_ok = grad_norm is None or math.isfinite(grad_norm) or self.scaler is not None
        applied = math.isfinite(loss) and grads_ok
        if applied:
            self._guard.updating()
        if applied and self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        elif applied:
            self.optimizer.step()
        return StepOutcome(loss, grad_norm, samples, tokens, applied, time.perf_counter() - started)

    def _clip_gradients(self) -> float | None:
        clip = self.config.optimizer.grad_clip
        if clip is None:
            return None
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        params = [
            p
            for group in self.optimizer.param_groups
            for p in group["params"]
            if p.grad is not None
        ]
        return float(torch.nn.utils.clip_grad_norm_(params, clip))

    def _handle_nonfinite(self, outcome: StepOutcome, consecutive: int) -> None:
        """Apply run.nonfinite_loss to a step that was not applied: raise, or record the skip."""
        self.optimizer.zero_grad(set_to_none=True)
        self.skipped_steps += 1
        what = (
            f"loss={outcome.loss}"
            if not math.isfinite(outcome.loss)
            else f"grad_norm={outcome.grad_norm}"
        )
        hint = (
            "lower the learning rate, set optimizer.grad_clip, check the data for fully ignored "
            "labels, or set run.nonfinite_loss: skip to skip such updates"
        )
        if self.config.run.nonfinite_loss == "stop":
            raise NonFiniteLossError(
                f"non-finite {what} at step {self.step + 1}; stopped without updating the "
                f"weights or writing a checkpoint ({hint})"
            )
        if consecutive >= MAX_CONSECUTIVE_SKIPS:
            raise NonFiniteLossError(
                f"{consecutive} consecutive non-finite updates up to step {self.step + 1}; "
                f"the run has diverged ({hint})"
            )
        self.logger.emit(
            "nonfinite_skip",
            {"step": self.step + 1, "loss": outcome.loss, "skipped_steps": self.skipped_steps},
        )

    def _advance(self, outcome: StepOutcome) -> None:
        """Count an applied step: scheduler, counters, coordinator callback, optional reset."""
        if self.scheduler is not None:
            self.scheduler.step()
        self.step += 1
        self.samples += outcome.samples
        self.tokens += outcome.tokens
        if self.coordinator is not None:
            reset = self.coordinator.after_optimizer_step(self.model, self.step)
            if reset and self.config.distributed.reset_inner_optimizer:
                self._reset_optimizer_state()

    def _reset_optimizer_state(self) -> None:
        reset = getattr(self.optimizer, "reset_state", None)
        if callable(reset):
            reset()
        else:
            self.optimizer.state.clear()

    # -------------------------------------------------------------------------------- evaluation

    @torch.no_grad()
    def evaluate(self, max_batches: int | None = None) -> float | None:
        """Return the validation loss (mean over valid labels) over up to max_batches eval
        batches.
        """
        if self.eval_dataloader is None:
            return None
        limit = max_batches if max_batches is not None else self.config.data.eval_steps
        was_training = self.model.training
        self.model.eval()
        total = weight = 0.0
        try:
            for index, batch in enumerate(self.eval_dataloader):
                if limit is not None and index >= limit:
                    break
                count = valid_label_count(batch)
                if count == 0:
                    continue
                output = call_model(self.model, move_batch(batch, self.device))
                loss = float(loss_from_output(output, batch))
                share = float(count) if count is not None else 1.0
                total, weight = total + loss * share, weight + share
        finally:
            self.model.train(was_training)
        return total / weight if weight else None

    def _maybe_evaluate(self) -> float | None:
        every = self.config.data.eval_every
        if self.eval_dataloader is None or every is None or self.step % every != 0:
            return None
        val_loss = self.evaluate()
        if val_loss is not None:
            self.logger.emit("eval", {"step": self.step, "val_loss": val_loss})
        return val_loss

    # ------------------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Return everything a checkpoint holds for an exact resume."""
        return {
            "format": CHECKPOINT_FORMAT,
            "step": self.step,
            "samples": self.samples,
            "tokens": self.tokens,
            "skipped_steps": self.skipped_steps,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "rng": capture_rng_state(),
            "data": self._stream.state_dict(),
            # Secrets never reach a checkpoint; a trainer without a config saves none.
            "config": self.config.to_dict(redact_secrets=True) if self._config_given else None,
            "coordinator": self.coordinator.state_dict() if self.coordinator is not None else None,
        }

    def _checkpoint(self, *, force: bool = False) -> Path | None:
        manager = self.checkpoint_manager
        if manager is None or not manager.enabled:
            return None
        if not (force or manager.should_save(self.step)):
            return None
        path = manager.save(self.step, self.state_dict())
        self.logger.emit("checkpoint", {"step": self.step, "path": str(path)})
        return path

    def resume(self, state: dict[str, Any] | None) -> None:
        """Restore a checkpoint state (from CheckpointManager.load_latest); None warns and starts
        fresh.
        """
        if state is None:
            self.logger.warning(
                "resume requested but no checkpoint was found; starting from step %d", self.step
            )
            return
        missing = [key for key in ("step", "model", "optimizer") if key not in state]
        if missing:
            raise ValueError(
                f"checkpoint state lacks {missing}; it was not written by this trainer"
            )
        # One line naming the mismatch and the fix (another model size or optimizer).
        config = self.config if self._config_given else None
        restore_model(self.model, state, config)
        restore_optimizer(self.optimizer, state, config)
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler") is not None:
            self.scaler.load_state_dict(state["scaler"])
        if self.coordinator is not None and state.get("coordinator") is not None:
            self.coordinator.load_state_dict(state["coordinator"])
        self.step = int(state["step"])
        self.samples = int(state.get("samples", 0))
        self.tokens = int(state.get("tokens", 0))
        self.skipped_steps = int(state.get("skipped_steps", 0))
        if state.get("data") is not None:
            self._stream.load_state_dict(state["data"])
        restore_rng_state(state.get("rng"))
        self.logger.info(
            "resumed at step %d from %s",
            self.step,
            state.get("checkpoint_path", "a state dict"),
        )

    def resume_latest(self) -> bool:
        """Resume from the checkpoint manager's newest valid checkpoint; return whether one was
        loaded.
        """
        if self.checkpoint_manager is None:
            raise ValueError("resume_latest() needs a checkpoint_manager")
        state = self.checkpoint_manager.load_latest(warn=self.logger.warning)
        self.resume(state)
        return state is not None

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
        target = self._target(max_steps)
        self.emergency_checkpoint = None
        if target == self.step:
            return TrainResult(self.step, self.samples, self.tokens, None, 0.0)
        started = time.perf_counter()
        first = (self.step, self.samples, self.tokens)
        progress = _FitProgress()
        bar = ProgressBar(
            total=target,
            initial=self.step,
            enabled=progress_enabled(self.config.logging.progress),
        )
        console_metrics = self.logger.console_metrics
        self.logger.console_metrics = console_metrics and not bar.active
        if self.coordinator is not None:
            self.coordinator.start()
        try:
            with StopSignal(enabled=True) as stop:
                while self.step < target and progress.stopped_by is None:
                    self._run_step(progress, bar)
                    progress.stopped_by = stop.received
            self._finish(progress, first_step=first[0])
        except Exception as error:
            self._save_emergency(error)
            raise
        finally:
            bar.close()
            self.logger.console_metrics = console_metrics
            if self.coordinator is not None:
                self.coordinator.stop()
        return self._result(progress, first, time.perf_counter() - started)

    def _run_step(self, progress: _FitProgress, bar: ProgressBar) -> None:
        """One optimizer step and what follows it: metrics, evaluation, a due checkpoint."""
        outcome = self._train_step()
        if not outcome.applied:
            progress.consecutive_skips += 1
            self._handle_nonfinite(outcome, progress.consecutive_skips)
            return
        progress.consecutive_skips = 0
        self._advance(outcome)
        self._guard.applied()
        progress.final_loss = outcome.loss
        self._log_step(outcome)
        tokens_per_s = outcome.tokens / outcome.seconds if outcome.seconds > 0 else 0.0
        bar.update(self.step, outcome.loss, tokens_per_s)
        evaluated = self._maybe_evaluate()
        progress.val_loss = evaluated if evaluated is not None else progress.val_loss
        progress.checkpoint = self._checkpoint() or progress.checkpoint

    def _save_emergency(self, error: Exception) -> None:
        """After a failure mid-run, checkpoint the last sound state (never over a good checkpoint)
        and log where it is; a failed checkpoint write or a non-finite loss saves nothing. Never
        raises: the original failure is what the caller must see.
        """
        manager = self.checkpoint_manager
        skip = isinstance(error, (CheckpointError, NonFiniteLossError))  # disk failed; policy
        if manager is None or not manager.enabled or skip:
            self._guard.applied()
            return
        failed_at = f"{type(error).__name__} at step {self._guard.failing_step(self.step)}"
        try:
            state = self._guard.sound_state(self.model, self.state_dict)
            if state is None:
                self.logger.error("%s: the model may be half-updated or non-finite", failed_at)
                return
            path = manager.path_for(state["step"])
            if not path.is_file():
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

    def _log_step(self, outcome: StepOutcome) -> None:
        if not self.logger.wants_step(self.step):
            return
        record = self._metrics.record(
            step=self.step,
            loss=outcome.loss,
            lr=self.optimizer.param_groups[0]["lr"],
            grad_norm=outcome.grad_norm,
            samples=outcome.samples,
            tokens=outcome.tokens,
            step_time=outcome.seconds,
        )
        self.logger.emit("train_step", record)

    def _finish(self, progress: _FitProgress, *, first_step: int) -> None:
        """After the loop: the on-signal or final checkpoint, when due and not yet written."""
        manager = self.checkpoint_manager
        written_now = manager is not None and progress.checkpoint == manager.path_for(self.step)
        if progress.stopped_by is not None:
            if self.config.checkpoint.save_on_signal and not written_now:
                progress.checkpoint = self._checkpoint(force=True) or progress.checkpoint
            self.logger.warning("%s received: stopped at step %d", progress.stopped_by, self.step)
        elif self.config.checkpoint.save_final and self.step > first_step and not written_now:
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
        if progress.val_loss is not None:
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

    train = fit  # 2.0 name of fit

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
